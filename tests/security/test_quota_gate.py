"""Quotas at the gate: a principal over its produce quota gets its answers delayed, told by
how much (throttle_time_ms), while a principal without a quota is not slowed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient
from tidewire.protocol.messages import ProducePartition, ProduceRequest, ProduceResponse
from tidewire.records import BatchBuilder
from tidewire.security.config import SecurityConfig
from tidewire.security.credentials import Credentials
from tidewire.security.model import QuotaRecord
from tidewire.security.quotas import QuotaLimits, Quotas
from tidewire.server import TcpServer
from tidewire.server.gate import gate_for
from tidewire.server.tcp import ServerConfig


def _batch(size: int) -> bytes:
    b = BatchBuilder()
    b.append(b"x" * size, timestamp_ms=0)
    return bytes(b.build())


async def _produce(client: AsyncClient, data: bytes) -> tuple[int, float]:
    req = ProduceRequest(partitions=[ProducePartition("q", 0, len(data))])
    started = time.monotonic()
    response = await client._t.request(req, [data])
    assert response is not None
    assert isinstance(response.body, ProduceResponse)
    assert not response.body.results[0].error_code
    return response.body.throttle_time_ms, time.monotonic() - started


def test_a_principal_over_its_produce_quota_is_delayed_and_told(tmp_path: Path) -> None:
    async def main() -> None:
        config = SecurityConfig(authentication=True, superusers="admin")
        broker = Broker(BrokerConfig(str(tmp_path / "data")), security=config)
        await broker.start()
        server = TcpServer(broker, ServerConfig(port=0))
        await server.start()
        try:
            gate = gate_for(broker)
            # A window of 10 x 0.1 s instead of 11 x 1 s, so the delays are tenths of seconds.
            gate.quotas = Quotas(QuotaLimits(), samples=10, sample_seconds=0.1)
            store = broker.security
            assert broker.bootstrap_key_file is not None
            admin = Credentials(broker.bootstrap_key_file.read_text().strip())
            await store.create_principal("slow", roles=["producer"])
            _, slow_key = await store.create_key("slow")
            await store.set_quota(QuotaRecord(principal="slow", produce_bytes_per_s=100_000))
            data = _batch(40_000)
            async with AsyncClient(f"127.0.0.1:{server.port}", credentials=admin) as a:
                await a.create_topic("q", partitions=1)
                admin_throttles = [(await _produce(a, data))[0] for _ in range(4)]
            assert admin_throttles == [0, 0, 0, 0]  # no quota: never throttled
            async with AsyncClient(
                f"127.0.0.1:{server.port}", credentials=Credentials(slow_key)
            ) as c:
                results = [await _produce(c, data) for _ in range(4)]
            throttled = [(ms, took) for ms, took in results if ms > 0]
            assert throttled, results  # 160 KB in well under a second at 100 KB/s
            for ms, took in throttled:
                assert took >= ms / 1000 * 0.9  # the answer really waited that long
            assert gate.stats()["throttle_seconds_produce"] > 0
        finally:
            await server.close()
            await broker.close()

    asyncio.run(main())
