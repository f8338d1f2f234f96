"""Embedded mode: the broker and its server inside the test's own process, used through the
clients as a separate server would be, through the broker core directly, and from synchronous
code on a background thread; leaving drains it cleanly."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from tidewire.client import Client, Message
from tidewire.embedded import EmbeddedBroker
from tidewire.errors import InvalidConfigError, UnknownTopicError
from tidewire.storage import FsyncPolicy, LogConfig
from tidewire.storage.manager import CLEAN_SHUTDOWN_FILE


def test_async_embedded_broker_serves_clients_and_drains(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def main() -> None:
        async with EmbeddedBroker(str(data), default_partitions=2) as eb:
            async with eb.client() as client:
                assert await client.produce("events", 1, [Message(b"hello")]) == 0
                got = await client.fetch("events", 1, 0)
                assert [r.value for r in got.records] == [b"hello"]
            # The broker core is there too, for in-process calls.
            assert [s.log_end_offset for s in eb.broker.describe("events")] == [0, 1]
        assert eb.server is None
        with pytest.raises(RuntimeError, match="not listening"):
            _ = eb.addr

    asyncio.run(main())
    assert (data / CLEAN_SHUTDOWN_FILE).exists()

    async def again() -> None:  # the data is there after a restart
        async with EmbeddedBroker(str(data), listen=False) as eb:
            assert eb.broker.logs.was_clean
            assert eb.broker.describe("events")[1].log_end_offset == 1

    asyncio.run(again())


def test_sync_programs_run_it_on_a_thread(tmp_path: Path) -> None:
    eb = EmbeddedBroker(str(tmp_path / "d"), log=LogConfig(fsync=FsyncPolicy.ALWAYS))
    with eb.running() as running, Client(running.addr) as client:
        port = int(running.addr.rsplit(":", 1)[1])
        client.create_topic("t", partitions=1)
        assert client.produce("t", 0, [Message(b"a"), Message(b"b")]) == 0
        assert [r.value for r in client.fetch("t", 0, 0).records] == [b"a", b"b"]
        with pytest.raises(UnknownTopicError):
            client.describe_topic("nope")
    assert eb.server is None
    with socket.socket() as s:  # nothing listens there any more
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_bad_settings_are_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="not a broker setting"):
        EmbeddedBroker(str(tmp_path), colour="blue")
    with pytest.raises(InvalidConfigError, match="default_partitions"):
        EmbeddedBroker(str(tmp_path), default_partitions=0)


def test_a_port_in_use_fails_at_start(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        eb = EmbeddedBroker(str(tmp_path / "d"), port=port)
        with pytest.raises(OSError, match="address already in use"), eb.running():
            pass
        assert eb.server is None
