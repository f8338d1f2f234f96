"""Authentication and authorization on the Kafka listener: nothing but ApiVersions and
the SASL exchange before authenticating; SCRAM-SHA-256/512 over SaslHandshake v1 +
SaslAuthenticate and over the legacy v0 exchange (raw tokens); PLAIN with the key's id and
secret or the whole key; a wrong key answered and the connection closed; ACLs per topic
(TOPIC_AUTHORIZATION_FAILED on the denied topic, the other served); private topics."""

from __future__ import annotations

import struct
from pathlib import Path

from tests.kafka._support import (
    Wire,
    aio,
    batch,
    fetch_body,
    kafka_broker,
    produce_body,
    values_of,
    wire,
)
from tidewire.broker import Broker
from tidewire.protocol.kafka import ApiKey, ErrorCode
from tidewire.security.config import SecurityConfig
from tidewire.security.keys import parse_key
from tidewire.security.model import Acl, Operation, ResourceType
from tidewire.security.scram import ScramClient

SECURE = SecurityConfig(
    authentication=True,
    superusers="admin",
    allow_plain_without_tls=True,
    scram_iterations=4096,
    auth_failure_delay_ms=0,
)


async def _user(broker: Broker, name: str) -> str:
    await broker.security.create_principal(name)
    _, key = await broker.security.create_key(name)
    return key


async def _scram(w: Wire, key: str, mechanism: str = "SCRAM-SHA-256") -> None:
    key_id, secret = parse_key(key)
    hs = await w.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})
    assert hs["error_code"] == 0
    assert mechanism in hs["mechanisms"]
    c = ScramClient(mechanism, key_id, secret)
    first = await w.call(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": c.first()})
    assert first["error_code"] == 0, first["error_message"]
    final = await w.call(
        ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": c.final(bytes(first["auth_bytes"]))}
    )
    assert final["error_code"] == 0, final["error_message"]
    c.verify(bytes(final["auth_bytes"]))


@aio
async def test_nothing_but_the_handshake_before_authenticating(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path, security=SECURE) as (_, k), wire(k.port) as w:
        assert (await w.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == 0
        await w.send(ApiKey.METADATA, 8, {"topics": None})
        assert await w.closed()


@aio
async def test_scram_over_sasl_authenticate(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path, security=SECURE) as (b, k):
        key = await _user(b, "alice")
        await b.security.add_acls(
            [
                Acl(
                    principal="alice",
                    resource_type=ResourceType.TOPIC,
                    pattern="t",
                    operation=Operation.ALL,
                )
            ]
        )
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            async with wire(k.port) as w:
                await _scram(w, key, mechanism)
                got = await w.call(ApiKey.PRODUCE, 7, produce_body("t", 0, batch([b"a"])))
                assert got["responses"][0]["partition_responses"][0]["error_code"] == 0


@aio
async def test_a_wrong_key_is_answered_then_the_connection_closes(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path, security=SECURE) as (b, k), wire(k.port) as w:
        key = await _user(b, "alice")
        key_id, secret = parse_key(key)
        await w.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"})
        c = ScramClient("SCRAM-SHA-256", key_id, secret[:-2] + "xx")
        first = await w.call(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": c.first()})
        final = await w.call(
            ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": c.final(bytes(first["auth_bytes"]))}
        )
        assert final["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert final["error_message"]
        assert await w.closed()


@aio
async def test_unknown_mechanism_and_plain(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path, security=SECURE) as (b, k):
        key = await _user(b, "alice")
        key_id, secret = parse_key(key)
        async with wire(k.port) as w:
            hs = await w.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
            assert hs["error_code"] == ErrorCode.UNSUPPORTED_SASL_MECHANISM
            assert "SCRAM-SHA-256" in hs["mechanisms"]
        for username, password in ((key_id, secret), ("anyone", key)):
            async with wire(k.port) as w:
                assert (await w.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}))[
                    "error_code"
                ] == 0
                token = b"\0" + username.encode() + b"\0" + password.encode()
                got = await w.call(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": token})
                assert got["error_code"] == 0, got["error_message"]
                assert (await w.call(ApiKey.METADATA, 8, {"topics": None}))["brokers"]


@aio
async def test_the_legacy_exchange_with_raw_tokens(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path, security=SECURE) as (b, k), wire(k.port) as w:
        key = await _user(b, "alice")
        key_id, secret = parse_key(key)
        hs = await w.call(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "SCRAM-SHA-256"})
        assert hs["error_code"] == 0
        c = ScramClient("SCRAM-SHA-256", key_id, secret)

        async def token(data: bytes) -> bytes:
            w.writer.write(struct.pack(">i", len(data)) + data)
            (size,) = struct.unpack(">i", await w.reader.readexactly(4))
            return await w.reader.readexactly(size)

        server_first = await token(c.first())
        c.verify(await token(c.final(server_first)))
        assert (await w.call(ApiKey.METADATA, 8, {"topics": None}))["brokers"]


@aio
async def test_acls_per_topic_and_private_topics(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path, security=SECURE) as (b, k), wire(k.port) as w:
        b.create_topic("mine", 1)
        b.create_topic("theirs", 1)
        key = await _user(b, "alice")
        await b.security.add_acls(
            [
                Acl(
                    principal="alice",
                    resource_type=ResourceType.TOPIC,
                    pattern="mine",
                    operation=Operation.ALL,
                )
            ]
        )
        await _scram(w, key)
        body = produce_body("mine", 0, batch([b"a"]))
        body["topic_data"].append(
            {"name": "theirs", "partition_data": [{"index": 0, "records": batch([b"b"])}]}
        )
        got = await w.call(ApiKey.PRODUCE, 7, body)
        codes = {r["name"]: r["partition_responses"][0]["error_code"] for r in got["responses"]}
        assert codes == {"mine": 0, "theirs": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert b.high_watermark("theirs", 0) == 0
        meta = await w.call(ApiKey.METADATA, 8, {"topics": None})
        assert [t["name"] for t in meta["topics"]] == ["mine"]
        got = await w.call(ApiKey.FETCH, 11, fetch_body("theirs", 0, 0))
        assert got["responses"][0]["partitions"][0]["error_code"] == (
            ErrorCode.TOPIC_AUTHORIZATION_FAILED
        )
        got = await w.call(ApiKey.FETCH, 11, fetch_body("mine", 0, 0))
        assert values_of(got["responses"][0]["partitions"][0]["records"]) == [b"a"]
        got = await w.call(ApiKey.FETCH, 11, fetch_body("__security", 0, 0))
        assert got["responses"][0]["partitions"][0]["error_code"] == (
            ErrorCode.TOPIC_AUTHORIZATION_FAILED
        )
        created = await w.call(
            ApiKey.CREATE_TOPICS,
            3,
            {"topics": [{"name": "new", "num_partitions": 1, "replication_factor": 1}]},
        )
        assert created["topics"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED


@aio
async def test_a_produce_over_the_quota_is_answered_late_saying_so(tmp_path: Path) -> None:
    quota = SecurityConfig(
        authentication=True,
        superusers="admin",
        auth_failure_delay_ms=0,
        quota_produce_bytes_per_s=10_000,
    )
    async with kafka_broker(tmp_path, security=quota) as (b, k), wire(k.port) as w:
        key = await _user(b, "alice")
        await b.security.add_acls(
            [
                Acl(
                    principal="alice",
                    resource_type=ResourceType.TOPIC,
                    pattern="q",
                    operation=Operation.ALL,
                )
            ]
        )
        await _scram(w, key)
        small = await w.call(ApiKey.PRODUCE, 7, produce_body("q", 0, batch([b"x"])))
        assert small["throttle_time_ms"] == 0
        # About 125 KB against 10,000 B/s over an 11 s window (11 samples of 1 s, as
        # Kafka): about 1.5 s late.
        big = await w.call(ApiKey.PRODUCE, 7, produce_body("q", 0, batch([b"y" * 125_000])))
        assert big["responses"][0]["partition_responses"][0]["error_code"] == 0
        assert big["throttle_time_ms"] > 0


@aio
async def test_an_authenticated_connection_cannot_authenticate_again(tmp_path: Path) -> None:
    """session_lifetime_ms is 0, so clients never re-authenticate (KIP-368): a second
    handshake on an authenticated connection, which could only change its principal, is
    refused with ILLEGAL_SASL_STATE and the connection stays who it was."""
    async with kafka_broker(tmp_path, security=SECURE) as (b, k), wire(k.port) as w:
        await _scram(w, await _user(b, "alice"))
        again = await w.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"})
        assert again["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
        assert (await w.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == 0
