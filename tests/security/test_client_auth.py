"""Authentication on every client: each client class given ``credentials=`` publishes or reads
against a broker with authentication on; a wrong or missing key fails with
AuthenticationFailedError at once (no hang, no endless retry); the key never shows in logs."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tidewire.broker import Broker, BrokerConfig
from tidewire.client import (
    AsyncClient,
    AsyncConsumer,
    AsyncGroupConsumer,
    AsyncProducer,
    AsyncSubscriber,
    Consumer,
    Credentials,
    GroupConsumer,
    Producer,
    Subscriber,
)
from tidewire.errors import AuthenticationFailedError, AuthorizationFailedError
from tidewire.security.config import SecurityConfig
from tidewire.security.keys import parse_key
from tidewire.security.model import CLUSTER_NAME, Acl, Operation, QuotaRecord, ResourceType
from tidewire.server import TcpServer
from tidewire.server.tcp import ServerConfig

#: Long enough for a loaded 2-core machine, far below the producer's delivery timeout (120 s):
#: a refused key must fail the send, not be retried until then.
FAILS_WITHIN_S = 20.0


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in a fresh event loop."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run


@asynccontextmanager
async def secured(tmp_path: Path) -> AsyncIterator[tuple[Broker, str]]:
    """A broker with authentication on (superuser "admin") and topic "t" of 2 partitions."""
    broker = Broker(
        BrokerConfig(str(tmp_path / "data")),
        security=SecurityConfig(authentication=True, superusers="admin"),
    )
    await broker.start()
    server = TcpServer(broker, ServerConfig(port=0))
    await server.start()
    addr = f"127.0.0.1:{server.port}"
    try:
        async with AsyncClient(addr, credentials=Credentials(admin_key(broker))) as admin:
            await admin.create_topic("t", partitions=2)
        yield broker, addr
    finally:
        await server.close()
        await broker.close()


def admin_key(broker: Broker) -> str:
    assert broker.bootstrap_key_file is not None
    return broker.bootstrap_key_file.read_text().strip()


async def new_user(broker: Broker, name: str, *roles: str) -> str:
    await broker.security.create_principal(name, roles=roles)
    _, key = await broker.security.create_key(name)
    return key


async def writer(broker: Broker, name: str = "writer") -> str:
    """A key of a principal with the producer role and write on the cluster: the idempotent
    producer (the default) asks the broker for a producer id, which needs it."""
    key = await new_user(broker, name, "producer")
    await broker.security.add_acls(
        [
            Acl(
                principal=name,
                resource_type=ResourceType.CLUSTER,
                pattern=CLUSTER_NAME,
                operation=Operation.WRITE,
            )
        ]
    )
    return key


def wrong_key(key: str) -> str:
    """The same key id with another secret."""
    key_id, secret = parse_key(key)
    return f"twk_{key_id}_{'A' if secret[0] != 'A' else 'B'}{secret[1:]}"


async def publish(p: AsyncProducer, value: bytes = b"v", partition: int = 0) -> int:
    """Send one message and wait for it: its offset. A refused key fails ``send`` (the topic's
    metadata is looked up first) or its future (the producer id or the produce request)."""
    return (await (await p.send("t", value, partition=partition))).offset


# -- producers -------------------------------------------------------------------------------


@aio
async def test_async_producer_publishes_with_a_key_of_a_producer(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, addr):
        key = await writer(broker)
        async with AsyncProducer(addr, credentials=Credentials(key), linger_ms=0) as p:
            futs = [await p.send("t", b"v%d" % i, partition=i % 2) for i in range(10)]
            offsets = [(await f).offset for f in futs]
        assert sorted(offsets) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        async with AsyncClient(addr, credentials=Credentials(admin_key(broker))) as admin:
            got = await admin.fetch("t", 0, 0)
        assert [r.value for r in got.records] == [b"v0", b"v2", b"v4", b"v6", b"v8"]


@aio
async def test_async_producer_with_scram_sha_512(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, addr):
        key = await writer(broker)
        async with AsyncProducer(addr, credentials=Credentials(key, "SCRAM-SHA-512")) as p:
            md = await (await p.send("t", b"v", partition=1))
        assert md.offset == 0


@aio
@pytest.mark.parametrize("which", ["wrong", "missing"])
async def test_async_producer_send_fails_with_a_wrong_or_missing_key(
    tmp_path: Path, which: str
) -> None:
    async with secured(tmp_path) as (broker, addr):
        key = await writer(broker)
        creds = Credentials(wrong_key(key)) if which == "wrong" else None
        start = time.monotonic()
        async with AsyncProducer(addr, credentials=creds, linger_ms=0) as p:
            with pytest.raises(AuthenticationFailedError):
                await publish(p)
        assert time.monotonic() - start < FAILS_WITHIN_S
        assert broker.log("t", 0).log_end_offset == 0


def test_blocking_producer_publishes_and_a_wrong_key_fails(tmp_path: Path) -> None:
    async def setup() -> None:
        async with secured(tmp_path) as (broker, addr):
            key = await writer(broker)
            results: list[object] = []

            def work() -> None:
                with Producer(addr, credentials=Credentials(key), linger_ms=0) as p:
                    results.append(p.send("t", b"v", partition=0).result(FAILS_WITHIN_S).offset)
                start = time.monotonic()
                with Producer(addr, credentials=Credentials(wrong_key(key))) as p:
                    try:
                        p.send("t", b"v", partition=0).result(FAILS_WITHIN_S)
                    except AuthenticationFailedError as exc:
                        results.append(exc)
                results.append(time.monotonic() - start)

            await asyncio.to_thread(work)
            assert results[0] == 0
            assert isinstance(results[1], AuthenticationFailedError)
            assert isinstance(results[2], float)
            assert results[2] < FAILS_WITHIN_S
            assert broker.log("t", 0).log_end_offset == 1

    asyncio.run(setup())


@aio
async def test_a_producer_without_write_permission_is_refused(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, addr):
        key = await new_user(broker, "reader", "consumer")
        async with AsyncProducer(addr, credentials=Credentials(key), linger_ms=0) as p:
            with pytest.raises(AuthorizationFailedError):
                await (await p.send("t", b"v", partition=0))


@aio
async def test_the_key_never_shows_in_the_producers_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with secured(tmp_path) as (broker, addr):
        key = await writer(broker)
        bad = wrong_key(key)
        async with AsyncProducer(addr, credentials=Credentials(key)) as p:
            await (await p.send("t", b"v", partition=0))
        async with AsyncProducer(addr, credentials=Credentials(bad)) as p:
            with pytest.raises(AuthenticationFailedError) as info:
                await (await p.send("t", b"v", partition=0))
        for secret in (key, bad, parse_key(key)[1], parse_key(bad)[1]):
            assert secret not in caplog.text
            assert secret not in str(info.value)
            assert secret not in repr(Credentials(key))


@aio
async def test_a_revoked_key_fails_the_send_future_and_is_not_retried(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, addr):
        key = await writer(broker)
        async with AsyncProducer(addr, credentials=Credentials(key), linger_ms=0) as p:
            assert await publish(p) == 0  # metadata and producer id known from here on
            await broker.security.revoke_key(Credentials(key).key_id)
            start = time.monotonic()
            fut = await p.send("t", b"after", partition=0)
            with pytest.raises(AuthenticationFailedError):
                await fut
            assert time.monotonic() - start < FAILS_WITHIN_S
        assert broker.log("t", 0).log_end_offset == 1


# -- readers ---------------------------------------------------------------------------------


async def fill(broker: Broker, addr: str, n: int = 6) -> None:
    """Messages v0.. on partition 0 of "t", published as the superuser."""
    async with AsyncProducer(addr, credentials=Credentials(admin_key(broker)), linger_ms=0) as p:
        for i in range(n):
            await publish(p, b"v%d" % i)


async def reader(broker: Broker, name: str = "reader") -> str:
    """A key of a principal with the consumer role (read topics and groups)."""
    return await new_user(broker, name, "consumer")


@aio
async def test_async_consumer_reads_with_a_key_and_fails_without(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, addr):
        await fill(broker, addr)
        key = await reader(broker)
        async with AsyncConsumer(addr, credentials=Credentials(key)) as c:
            await c.assign([("t", 0, "earliest")])
            got = await c.poll(FAILS_WITHIN_S, max_records=6)
        assert [r.value for r in got] == [b"v%d" % i for i in range(len(got))]
        assert got
        for creds in (None, Credentials(wrong_key(key))):
            start = time.monotonic()
            async with AsyncConsumer(addr, credentials=creds) as c:
                with pytest.raises(AuthenticationFailedError):
                    await c.assign([("t", 0, "earliest")])
            assert time.monotonic() - start < FAILS_WITHIN_S


def test_blocking_consumer_group_consumer_and_subscriber_read_with_a_key(tmp_path: Path) -> None:
    async def main() -> None:
        async with secured(tmp_path) as (broker, addr):
            await fill(broker, addr)
            key = await reader(broker)

            def read() -> tuple[list[bytes], list[bytes]]:
                with Consumer(addr, credentials=Credentials(key)) as c:
                    c.assign([("t", 0, 0)])
                    pulled = [r.value or b"" for r in c.poll(FAILS_WITHIN_S, max_records=2)]
                with Subscriber(addr, credentials=Credentials(key)) as s:
                    s.subscribe([("t", 0, 0)])
                    pushed = [r.value or b"" for r in s.poll(FAILS_WITHIN_S, max_records=2)]
                with GroupConsumer(
                    addr,
                    "blocking",
                    topics=["t"],
                    auto_offset_reset="earliest",
                    credentials=Credentials(key),
                ) as g:
                    grouped: list[bytes] = []
                    deadline = time.monotonic() + FAILS_WITHIN_S
                    while len(grouped) < 6 and time.monotonic() < deadline:
                        grouped += [r.value or b"" for r in g.poll(1.0)]
                assert sorted(grouped) == sorted(b"v%d" % i for i in range(6))
                with Consumer(addr, credentials=Credentials(wrong_key(key))) as c:
                    c.assign([("t", 0, 0)])  # an offset: nothing asked of the broker yet
                    with pytest.raises(AuthenticationFailedError):
                        c.poll(FAILS_WITHIN_S)
                return pulled, pushed

            pulled, pushed = await asyncio.to_thread(read)
            assert pulled[0] == b"v0"
            assert pushed[0] == b"v0"

    asyncio.run(main())


@aio
async def test_async_subscriber_reads_with_a_key_and_fails_without(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, addr):
        await fill(broker, addr)
        key = await reader(broker)
        async with AsyncSubscriber(addr, credentials=Credentials(key)) as s:
            await s.subscribe([("t", 0, "earliest")])
            got = await s.poll(FAILS_WITHIN_S)
        assert got[0].value == b"v0"
        start = time.monotonic()
        async with AsyncSubscriber(addr, credentials=Credentials(wrong_key(key))) as s:
            with pytest.raises(AuthenticationFailedError):
                await s.subscribe([("t", 0, "earliest")])
        assert time.monotonic() - start < FAILS_WITHIN_S


@aio
@pytest.mark.parametrize("delivery", ["pull", "push"])
async def test_group_consumer_joins_and_reads_with_a_key(tmp_path: Path, delivery: str) -> None:
    async with secured(tmp_path) as (broker, addr):
        await fill(broker, addr)
        key = await reader(broker)
        async with AsyncGroupConsumer(
            addr,
            "g",
            topics=["t"],
            auto_offset_reset="earliest",
            delivery=delivery,
            credentials=Credentials(key),
            session_timeout_ms=30_000,
        ) as g:
            got: list[bytes] = []
            deadline = time.monotonic() + FAILS_WITHIN_S
            while len(got) < 6 and time.monotonic() < deadline:
                got += [r.value or b"" for r in await g.poll(1.0)]
            await g.commit()
        assert sorted(got) == sorted(b"v%d" % i for i in range(6))
        async with AsyncClient(addr, credentials=Credentials(key)) as c:
            assert (await c.committed_offsets("g", [("t", 0)]))[("t", 0)] == 6


@aio
async def test_group_consumer_with_a_wrong_key_fails_its_first_poll(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, addr):
        key = await reader(broker)
        start = time.monotonic()
        async with AsyncGroupConsumer(
            addr, "g", topics=["t"], credentials=Credentials(wrong_key(key))
        ) as g:
            with pytest.raises(AuthenticationFailedError):
                await g.poll(FAILS_WITHIN_S)
        assert time.monotonic() - start < FAILS_WITHIN_S


# -- quotas ----------------------------------------------------------------------------------


@aio
async def test_throttle_time_is_summed_by_the_producer_and_the_consumer(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, addr):
        key = await writer(broker)
        # 1,000 bytes/s: one message of 11,500 bytes is 1.5 s over what the 10 s window
        # lets through, so its answer is held back (and says so) for about that long.
        await broker.security.set_quota(
            QuotaRecord(principal="writer", produce_bytes_per_s=1000, fetch_bytes_per_s=1000)
        )
        async with AsyncProducer(addr, credentials=Credentials(key), linger_ms=0) as p:
            assert p.throttle_time_ms_total == 0
            await publish(p, b"x" * 11_500)
            assert 500 < p.throttle_time_ms_total <= 5000
        await broker.security.add_acls(
            [
                Acl(
                    principal="writer",
                    resource_type=ResourceType.TOPIC,
                    pattern="t",
                    operation=Operation.READ,
                )
            ]
        )
        async with AsyncConsumer(addr, credentials=Credentials(key)) as c:
            await c.assign([("t", 0, 0)])
            assert [r.offset for r in await c.poll(FAILS_WITHIN_S)] == [0]
            assert 500 < c.throttle_time_ms_total <= 5000
