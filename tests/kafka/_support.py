"""Test support for the Kafka listener: a broker with a Kafka listener on a free port, and
a raw Kafka client speaking through the codec (``encode_request`` / ``decode_response``)."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from tidewire.broker import Broker, BrokerConfig
from tidewire.protocol.kafka import RequestHeader, decode_response, encode_request
from tidewire.records import BatchBuilder, iter_batches, iter_records
from tidewire.security.config import SecurityConfig
from tidewire.server.kafka.listener import KafkaServer
from tidewire.server.tcp import ServerConfig

#: Bound on every wait of these tests for an answer that must come (generous: a loaded CI).
ANSWER_S = 20.0
T0 = 1_700_000_000_000


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in a fresh event loop."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run


@asynccontextmanager
async def kafka_broker(
    tmp_path: Path,
    *,
    security: SecurityConfig | None = None,
    server: ServerConfig | None = None,
    **broker: Any,
) -> AsyncIterator[tuple[Broker, KafkaServer]]:
    """A started broker and its Kafka listener on 127.0.0.1, a free port; both stopped."""
    b = Broker(BrokerConfig(str(tmp_path / "data"), **broker), security=security)
    await b.start()
    k = KafkaServer(b, server or ServerConfig(port=0, kafka_port=0))
    try:
        await k.start()
        yield b, k
    finally:
        await k.close(grace_s=1.0)
        await b.close()


async def until(condition: Callable[[], bool], timeout_s: float = ANSWER_S) -> None:
    """Wait until ``condition()`` holds (checked each loop turn of 10 ms), or fail."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


class Wire:
    """One raw Kafka connection: requests encoded by the codec, answers read in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, port: int) -> Wire:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        return cls(r, w)

    async def send(self, api_key: int, version: int, body: dict[str, Any]) -> int:
        """Send a request; its correlation id."""
        cid = next(self._ids)
        self.writer.write(encode_request(RequestHeader(api_key, version, cid, "test"), body))
        await self.writer.drain()
        return cid

    async def receive(self, api_key: int, version: int) -> tuple[int, dict[str, Any]]:
        size = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), ANSWER_S), "big")
        frame = await asyncio.wait_for(self.reader.readexactly(size), ANSWER_S)
        return decode_response(api_key, version, frame)

    async def call(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        cid = await self.send(api_key, version, body)
        got, answer = await self.receive(api_key, version)
        assert got == cid
        return answer

    async def closed(self) -> bool:
        """Whether the broker closes the connection (within ANSWER_S), reading what is left."""
        try:
            while await asyncio.wait_for(self.reader.read(65536), ANSWER_S):
                pass
        except ConnectionError:
            pass
        return True

    async def close(self) -> None:
        self.writer.close()
        with suppress(ConnectionError):
            await self.writer.wait_closed()


@asynccontextmanager
async def wire(port: int) -> AsyncIterator[Wire]:
    w = await Wire.connect(port)
    try:
        yield w
    finally:
        await w.close()


def batch(
    values: list[bytes],
    *,
    key: bytes | None = None,
    timestamp_ms: int = T0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    b = BatchBuilder(
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence
    )
    for i, v in enumerate(values):
        b.append(v, timestamp_ms=timestamp_ms + i, key=key)
    return b.build()


def values_of(records: Any) -> list[bytes | None]:
    """The values of every record in fetched ``records`` (bytes of whole batches)."""
    data = bytes(records or b"")
    out: list[bytes | None] = []
    for pos, h in iter_batches(data):
        out.extend(r.value for r in iter_records(data[pos : pos + h.size]))
    return out


def produce_body(topic: str, partition: int, records: bytes, acks: int = -1) -> dict[str, Any]:
    return {
        "transactional_id": None,
        "acks": acks,
        "timeout_ms": 10_000,
        "topic_data": [
            {"name": topic, "partition_data": [{"index": partition, "records": records}]}
        ],
    }


def fetch_body(
    topic: str, partition: int, offset: int, *, max_wait_ms: int = 0, min_bytes: int = 1
) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "max_wait_ms": max_wait_ms,
        "min_bytes": min_bytes,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
