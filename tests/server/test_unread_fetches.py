"""Clients that pipeline big fetches and never read the answers cost the broker a bounded
amount of memory (the fetch cap times a few, per connection), and other clients keep being
served meanwhile.

A broker runs in a process of its own; its resident memory (VmRSS) is read from /proc.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import msgspec
import pytest

from tests.server._broker_proc import BrokerProcess, broker_process
from tidewire.broker.core import DEFAULT_FETCH_MAX_BYTES
from tidewire.client import AsyncClient, Message
from tidewire.protocol.frames import FrameType, encode_frame
from tidewire.protocol.messages import ApiKey, FetchPartition, FetchRequest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

MIB = 1024 * 1024
#: Per connection: fetch answers unsent or being read (the broker's setting in this test).
MAX_UNSENT = 32 * MIB
#: Data in the topic: more than one capped answer, so every fetch is answered with the cap.
TOPIC_BYTES = 24 * MIB
#: Each non-reading client pipelines this many fetches, each asking for this much.
FETCHES = 48
FETCH_ASKS = 64 * MIB
NON_READERS = 3
#: What the broker may add to its memory while they wait: per non-reader, about MAX_UNSENT
#: of answers and one more answer overshooting (the bound counts a fetch before it is read;
#: the write buffer may hold the last answer whole), then the allocator's slack. Without the
#: bound it would be FETCHES x the cap per client (3 x 48 x 16 MiB = 2.3 GiB).
RSS_ALLOWANCE = NON_READERS * (MAX_UNSENT + 2 * DEFAULT_FETCH_MAX_BYTES) + 64 * MIB


def _fetch_frames(count: int) -> bytes:
    body = msgspec.msgpack.encode(
        FetchRequest(
            max_wait_ms=0,
            max_bytes=FETCH_ASKS,
            partitions=[FetchPartition("bulk", 0, 0, FETCH_ASKS)],
        )
    )
    frames = [encode_frame(FrameType.REQUEST, ApiKey.FETCH, 0, c, body, []) for c in range(count)]
    return b"".join(bytes(b) for frame in frames for b in frame)


async def _send_never_read(port: int) -> socket.socket:
    """Connect, send every fetch (as far as the broker takes them), read nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    data = _fetch_frames(FETCHES)
    sent = 0
    deadline = time.monotonic() + 5
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += sock.send(data[sent:])
        except BlockingIOError:
            await asyncio.sleep(0.01)
    return sock


async def _peak_rss(broker: BrokerProcess, seconds: float) -> int:
    peak = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, broker.rss_bytes())
        await asyncio.sleep(0.05)
    return peak


def test_non_reading_fetchers_cost_bounded_memory(tmp_path: Path) -> None:
    async def main(broker: BrokerProcess) -> None:
        async with AsyncClient(broker.addr) as client:
            await client.create_topic("bulk", 1)
            chunk = b"x" * (MIB - 1024)
            for _ in range(TOPIC_BYTES // MIB):
                await client.produce("bulk", 0, [Message(chunk)])
            await client.ping()
            baseline = broker.rss_bytes()
            socks = [await _send_never_read(broker.port) for _ in range(NON_READERS)]
            try:
                # Other clients are served meanwhile: pings, and a fetch of the same data.
                latencies = []
                for _ in range(20):
                    started = time.monotonic()
                    await asyncio.wait_for(client.ping(), 10)
                    latencies.append(time.monotonic() - started)
                got = await asyncio.wait_for(client.fetch("bulk", 0, 0, max_bytes=MIB), 10)
                assert got.records
                peak = await _peak_rss(broker, 2.0)
            finally:
                for s in socks:
                    s.close()
        grown = peak - baseline
        print(
            f"broker RSS {baseline / MIB:.0f} MiB before, peak {peak / MIB:.0f} MiB with "
            f"{NON_READERS} clients x {FETCHES} unread fetches; ping max "
            f"{max(latencies) * 1000:.1f} ms"
        )
        assert grown < RSS_ALLOWANCE, (
            f"the broker grew by {grown / MIB:.0f} MiB (allowed {RSS_ALLOWANCE / MIB:.0f} MiB)"
        )
        assert max(latencies) < 5.0

    with broker_process(
        tmp_path / "data", tmp_path / "broker.log", {"max_unsent_bytes": MAX_UNSENT}
    ) as broker:
        asyncio.run(main(broker))
