"""The drain at a stop, in this process (:func:`tidewire.server.drain.drain`): the listener
closes before anything is waited for, a request in flight finishes while a new one on the same
connection is refused with the retriable ``ShuttingDownError``, the grace period bounds what
runs, and a disk that is full at the stop is reported once, by its cause, without the
clean-shutdown marker. ``tests/server/test_drain_serve.py`` stops a real ``tidewire serve``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import typer

from tests.server._support import PROMPT_S, Client, batch, serve, until
from tidewire.broker import Broker, BrokerConfig
from tidewire.cli import _serve as serve_cli
from tidewire.config import load_settings
from tidewire.embedded import EmbeddedBroker
from tidewire.errors import RebalanceInProgressError, ShuttingDownError, StorageError
from tidewire.protocol import ResponseReceived
from tidewire.protocol.messages import (
    ApiKey,
    CreateTopicRequest,
    FetchPartition,
    FetchRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    ListTopicsRequest,
    ListTopicsResponse,
    PingRequest,
    SubscribePartition,
    SubscribeRequest,
)
from tidewire.server.drain import drain
from tidewire.server.handlers import HANDLERS, Handler
from tidewire.storage import FsyncPolicy, LogConfig
from tidewire.storage.faultfs import FaultFS
from tidewire.storage.manager import CLEAN_SHUTDOWN_FILE, LogManager

#: A grace period no test sits out: a drain that waits for it fails the test's PROMPT_S bound.
LONG_GRACE_S = 60.0


def assert_going_away(events: list[ResponseReceived]) -> None:
    """The last thing a drained connection hears: the broker is shutting down (retriable)."""
    assert len(events) == 1, events
    assert events[0].correlation_id == -1
    assert isinstance(events[0].error, ShuttingDownError)
    assert events[0].error.retriable


def slow_list_topics(started: asyncio.Event, release: asyncio.Event) -> Handler:
    """LIST_TOPICS that waits for ``release`` (a request that is in flight as long as a test
    wants); ``started`` is set once it waits."""
    original = HANDLERS[ApiKey.LIST_TOPICS]

    async def handler(*args: object) -> object:
        started.set()
        await release.wait()
        return await original(*args)  # type: ignore[arg-type]

    return handler  # type: ignore[return-value]


def test_in_flight_finishes_new_requests_are_refused_new_connections_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        started, release = asyncio.Event(), asyncio.Event()
        monkeypatch.setitem(HANDLERS, ApiKey.LIST_TOPICS, slow_list_topics(started, release))
        async with (
            serve(tmp_path) as (broker, server),
            Client.connect(server) as busy,
            Client.connect(server) as idle,
        ):
            await idle.ping()
            port = server.port
            slow = busy.send(ListTopicsRequest())
            await asyncio.wait_for(started.wait(), PROMPT_S)
            draining = asyncio.ensure_future(drain(broker, server, None, grace_s=LONG_GRACE_S))
            await until(lambda: server.draining)
            # Refused at once, while the drain still waits for the request in flight.
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", port)
            assert_going_away(await idle.until_closed())
            refused = await busy.rpc(PingRequest())
            assert isinstance(refused.error, ShuttingDownError), refused
            assert refused.error.retriable
            assert not draining.done()
            # The request in flight is answered as usual, then the connection goes away.
            release.set()
            answered = await busy.response(slow)
            assert answered.error is None
            assert isinstance(answered.body, ListTopicsResponse)
            assert_going_away(await busy.until_closed())
            report = await asyncio.wait_for(draining, PROMPT_S)
        assert (report.in_flight, report.refused, report.cut) == (1, 1, 0)

    asyncio.run(main())


def test_the_grace_period_bounds_a_request_that_does_not_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        started, never = asyncio.Event(), asyncio.Event()
        monkeypatch.setitem(HANDLERS, ApiKey.LIST_TOPICS, slow_list_topics(started, never))
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            c.send(ListTopicsRequest())
            await asyncio.wait_for(started.wait(), PROMPT_S)
            report = await asyncio.wait_for(drain(broker, server, None, grace_s=0.2), PROMPT_S)
            assert report.cut == 1
            assert_going_away(await c.until_closed())

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["1 request(s) still running after the 0.2 s grace period: cancelling them"]


def test_push_subscriptions_and_long_polls_end_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, broker={"auto_create_topics": True}) as (broker, server),
            Client.connect(server) as sub,
            Client.connect(server) as poll,
        ):
            await poll.call(CreateTopicRequest(name="t", partitions=1))
            await sub.call(
                SubscribeRequest(partitions=[SubscribePartition("t", 0, 0)], credit_bytes=1 << 20)
            )
            fetch = poll.send(
                FetchRequest(max_wait_ms=30_000, partitions=[FetchPartition("t", 0, 0, 1 << 20)])
            )
            await poll.ping()  # sent after the fetch: the fetch waits by now
            report = await asyncio.wait_for(
                drain(broker, server, None, grace_s=LONG_GRACE_S), PROMPT_S
            )
            answered = await poll.response(fetch)
            assert answered.error is None
            assert answered.body.partitions[0].size == 0
            assert_going_away(await poll.until_closed())
            assert_going_away(await sub.until_closed())
        assert report.cut == 0

    asyncio.run(main())


def test_a_member_waiting_in_a_join_is_told_to_join_again_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path) as (broker, server),
            Client.connect(server) as first,
            Client.connect(server) as second,
        ):
            await first.call(CreateTopicRequest(name="t", partitions=2))
            joined = await first.call(JoinGroupRequest(group_id="g", topics=["t"]))
            assert isinstance(joined, JoinGroupResponse)
            # A second member starts a rebalance that waits for the first to join again
            # (up to its 30 s rebalance timeout).
            waiting = second.send(JoinGroupRequest(group_id="g", topics=["t"]))
            await second.ping()  # sent after the join: the join waits by now
            report = await asyncio.wait_for(
                drain(broker, server, None, grace_s=LONG_GRACE_S), PROMPT_S
            )
            answer = await second.response(waiting)
            assert isinstance(answer.body, JoinGroupResponse), answer
            assert answer.body.error_code == RebalanceInProgressError.code  # retriable
            assert "shutting down" in answer.body.error_message
            assert_going_away(await second.until_closed())
        assert report.cut == 0

    asyncio.run(main())


# --- a disk that is full at the stop ------------------------------------------------------------


def test_a_full_disk_at_the_stop_is_reported_once_and_leaves_no_marker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``tidewire serve``'s own stop path, in this process, over the fault-injecting file
    system: the disk fills up after the data is appended and before the stop flushes it."""
    fs = FaultFS()

    class FullDiskBroker(Broker):
        def __init__(self, config: BrokerConfig, **kwargs: Any) -> None:
            super().__init__(config, **kwargs)
            # No periodic checkpoint (every second by default) may land between the fault
            # and the stop: the stop path's own report is what is checked.
            self.logs = LogManager(
                config.data_dir,
                default_config=config.log,
                fs=fs,
                checkpoint_interval_ms=3_600_000,
            )

        async def start(self) -> None:
            await super().start()
            self.create_topic("t", 2)
            for i in range(20):
                await self.produce("t", i % 2, batch([b"x" * 300]))
            fs.fail_kinds.update(write=errno.ENOSPC, create=errno.ENOSPC)
            # serve's own handler stops it (installed before the broker starts).
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(serve_cli, "Broker", FullDiskBroker)
    settings = load_settings(
        None,
        env={},
        flags={
            "data_dir": "/data",
            "port": 0,
            "fsync": FsyncPolicy.INTERVAL,
            "flush_interval_ms": 3_600_000,
            "event_loop": "asyncio",
        },
    )
    with caplog.at_level(logging.INFO), pytest.raises(typer.Exit) as stopped:
        asyncio.run(serve_cli._serve(settings, "asyncio"))
    assert stopped.value.exit_code == 1
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1, [r.getMessage() for r in loud]
    message = loud[0].getMessage()
    assert "No space left on device" in message
    assert "(ENOSPC)" in message
    assert "2 of 2 log(s) could not be flushed" in message
    assert "the clean-shutdown marker is not written" in message
    assert loud[0].exc_info is None
    assert not any("fsync" in r.getMessage() for r in caplog.records)
    assert not fs.exists(f"/data/{CLEAN_SHUTDOWN_FILE}")
    # The next start recovers (no marker), and finds what was appended.
    fs.fail_kinds.clear()
    mgr = LogManager("/data", default_config=LogConfig(), fs=fs).open()
    try:
        assert not mgr.was_clean
    finally:
        mgr.close()


def test_a_full_disk_at_the_stop_of_an_embedded_broker_raises_one_error() -> None:
    fs = FaultFS()

    async def main() -> None:
        eb = EmbeddedBroker("/data", log=LogConfig(fsync=FsyncPolicy.NEVER))
        eb.broker.logs = LogManager("/data", default_config=eb.config.log, fs=fs)
        await eb.start()
        eb.broker.create_topic("t", 3)
        for i in range(9):
            await eb.broker.produce("t", i % 3, batch([b"y" * 100]))
        fs.fail_kinds["sync"] = errno.ENOSPC
        with pytest.raises(StorageError) as failed:
            await eb.close()
        assert "3 of 3 log(s) could not be flushed" in failed.value.message
        assert "at the fsync of 00000000000000000000.log: No space left" in failed.value.message
        assert "(ENOSPC)" in failed.value.message

    asyncio.run(main())
    assert not fs.exists(f"/data/{CLEAN_SHUTDOWN_FILE}")
