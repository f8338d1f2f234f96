"""Descriptors under a low limit (``ulimit -n``), against a broker in a process of its own.

Thousands of partitions, each written, fit in a few hundred descriptors (log files are kept
open in a bounded cache); many idle connections do not starve segment rolls (max_connections
is lowered to what the limit leaves); the broker restarts with every partition; and an
explicit max_connections the limit cannot hold is refused at start, naming the numbers.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from tests.server._broker_proc import BrokerProcess, broker_process
from tidewire.client import AsyncClient, Message
from tidewire.protocol.messages import TopicConfig
from tidewire.server.tcp import RESERVED_DESCRIPTORS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: The descriptor limit the broker runs under (soft and hard).
NOFILE = 256
#: Log files the broker keeps open under it: a quarter of the limit.
FILES = NOFILE // 4
#: Connections that fit: the rest after the files and the reserve.
FIT = NOFILE - FILES - RESERVED_DESCRIPTORS
PARTITIONS = 2_000
#: Idle connections opened: more than fit.
IDLE = FIT + 40


async def _produce_everywhere(client: AsyncClient, topic: str, n: int) -> None:
    for start in range(0, n, 100):  # 100 pipelined at a time
        await asyncio.gather(
            *(
                client.produce(topic, p, [Message(f"m{p}".encode())])
                for p in range(start, min(start + 100, n))
            )
        )


async def _check_sample(client: AsyncClient, topic: str, n: int) -> None:
    for p in [*range(0, n, 97), n - 1]:
        got = await client.fetch(topic, p, 0)
        assert [r.value for r in got.records] == [f"m{p}".encode()], p


def test_thousands_of_partitions_and_idle_connections_under_a_low_limit(tmp_path: Path) -> None:
    async def first_run(broker: BrokerProcess) -> None:
        async with AsyncClient(broker.addr) as client:
            await client.create_topic("wide", PARTITIONS)
            await _produce_everywhere(client, "wide", PARTITIONS)
            assert broker.open_fds() < NOFILE
            # Idle connections past what fits: the extra ones are closed by the broker.
            idle = []
            for _ in range(IDLE):
                s = socket.socket()
                s.connect(("127.0.0.1", broker.port))
                idle.append(s)
            try:
                await client.create_topic("rolls", 1, TopicConfig(segment_bytes=1024))
                for i in range(60):  # a new segment every other batch
                    await client.produce("rolls", 0, [Message(bytes([i]) * 600)])
                offset, values = 0, []
                while offset < 60:  # one segment per fetch
                    got = await client.fetch("rolls", 0, offset)
                    values += [r.value for r in got.records]
                    offset = got.next_offset
                assert values == [bytes([i]) * 600 for i in range(60)]
                await _check_sample(client, "wide", PARTITIONS)
                assert broker.open_fds() < NOFILE
            finally:
                for s in idle:
                    s.close()

    async def second_run(broker: BrokerProcess) -> None:
        async with AsyncClient(broker.addr) as client:
            desc = await client.describe_topic("wide")
            assert len(desc.partitions) == PARTITIONS
            await _check_sample(client, "wide", PARTITIONS)
            await client.produce("wide", PARTITIONS - 1, [Message(b"after")])

    data, log = tmp_path / "data", tmp_path / "broker.log"
    with broker_process(data, log, nofile=NOFILE) as broker:
        asyncio.run(first_run(broker))
        assert broker.stop() == 0
    text = log.read_text()
    assert f"max_connections lowered from 10,000 to {FIT}" in text
    assert "Too many open files" not in text
    assert "ERROR" not in text, text
    with broker_process(data, tmp_path / "again.log", nofile=NOFILE) as broker:
        asyncio.run(second_run(broker))
        assert broker.stop() == 0
    assert "ERROR" not in (tmp_path / "again.log").read_text()


def test_max_connections_the_limit_cannot_hold_is_refused(tmp_path: Path) -> None:
    with broker_process(
        tmp_path / "data",
        tmp_path / "broker.log",
        {"max_connections": 5000},
        nofile=NOFILE,
        check_start=False,
    ) as broker:
        broker.proc.wait(60)
        assert broker.proc.returncode != 0
    text = broker.log()
    assert "max_connections=5,000 needs as many descriptors" in text
    assert f"the descriptor limit is {NOFILE}, of which {FILES} are kept for log files" in text
    assert f"at most {FIT} connections fit" in text
