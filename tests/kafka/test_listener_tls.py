"""TLS on the Kafka listener: librdkafka over SSL produces and reads back; with mutual TLS
the client certificate's principal is the Kafka connection's (ACLs apply to it, no SASL
needed); a plaintext client on the TLS port is closed alone."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.kafka._support import Wire
from tidewire.embedded import EmbeddedBroker
from tidewire.protocol.kafka import ApiKey, RequestHeader, encode_request
from tidewire.security.certs import issue, make_ca, write_key, write_pem
from tidewire.security.config import SecurityConfig, TlsConfig
from tidewire.security.model import Acl, Operation, ResourceType

confluent_kafka = pytest.importorskip("confluent_kafka")

WAIT_S = 30.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca()
    for name, issued in (
        ("ca", ca),
        ("server", issue(ca, "127.0.0.1", hosts=("127.0.0.1", "localhost"))),
        ("alice", issue(ca, "alice", client=True)),
    ):
        write_pem(d / f"{name}.pem", issued.cert_pem)
        write_key(d / f"{name}.key", issued.key_pem)
    return d


def _tls(d: Path, **settings: str) -> TlsConfig:
    return TlsConfig(
        tls_cert_file=str(d / "server.pem"), tls_key_file=str(d / "server.key"), **settings
    )


def _round_trip(conf: dict[str, str], topic: str) -> bytes | None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer(conf)
    producer.produce(topic, value=b"over tls")
    assert producer.flush(WAIT_S) == 0
    consumer = Consumer(conf | {"group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    deadline = time.monotonic() + WAIT_S
    got = None
    while got is None and time.monotonic() < deadline:
        got = consumer.poll(0.5)
    consumer.close()
    assert got is not None
    assert got.error() is None
    value: bytes | None = got.value()
    return value


def test_librdkafka_over_tls(pki: Path, tmp_path: Path) -> None:
    with EmbeddedBroker(str(tmp_path / "d"), kafka_port=0, tls=_tls(pki)).running() as eb:
        conf = {
            "bootstrap.servers": eb.kafka_bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(pki / "ca.pem"),
        }
        assert _round_trip(conf, "secure") == b"over tls"

        async def plaintext() -> None:
            r, w = await asyncio.open_connection("127.0.0.1", eb.kafka.port if eb.kafka else 0)
            w.write(encode_request(RequestHeader(ApiKey.API_VERSIONS, 0, 1, None), {}))
            assert await Wire(r, w).closed()
            w.close()

        asyncio.run(plaintext())


def test_a_client_certificate_names_the_principal(pki: Path, tmp_path: Path) -> None:
    tls = _tls(pki, tls_ca_file=str(pki / "ca.pem"), tls_client_auth="required")
    security = SecurityConfig(authentication=True, superusers="admin")
    eb = EmbeddedBroker(str(tmp_path / "d"), kafka_port=0, tls=tls, security=security)
    with eb.running():

        async def grant() -> None:
            await eb.broker.security.add_acls(
                [
                    Acl(
                        principal="alice",
                        resource_type=ResourceType.TOPIC,
                        pattern="mtls",
                        operation=Operation.ALL,
                    ),
                    # librdkafka asks for the coordinator of the group its consumer names,
                    # even with assign(); without READ on it that is refused.
                    Acl(
                        principal="alice",
                        resource_type=ResourceType.GROUP,
                        pattern="unused",
                        operation=Operation.READ,
                    ),
                ]
            )
            eb.broker.create_topic("mtls", 1)

        asyncio.run_coroutine_threadsafe(grant(), eb.loop).result(WAIT_S)
        conf = {
            "bootstrap.servers": eb.kafka_bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(pki / "ca.pem"),
            "ssl.certificate.location": str(pki / "alice.pem"),
            "ssl.key.location": str(pki / "alice.key"),
        }
        assert _round_trip(conf, "mtls") == b"over tls"
