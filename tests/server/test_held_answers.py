"""Answers of one loop turn go out in one write: the produce requests one group commit settles
are answered together (one ``writelines`` of the transport, one system call, one wake-up of
the client), in the order the requests came, and nothing written to the connection later (a
push, an error frame, a close) overtakes an answer held that way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.server._support import Client, batch, serve
from tests.storage.test_append_soon import HeldExecutor
from tidewire import _step
from tidewire.protocol.messages import (
    CreateTopicRequest,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    TopicConfig,
)
from tidewire.server import tcp
from tidewire.storage.flusher import set_flush_executor

#: Every test's topic: acknowledged after its group commit.
ALWAYS = TopicConfig(fsync="always")


class _Counting:
    """A transport that counts the calls that hand it bytes."""

    def __init__(self, inner: Any, calls: list[int]) -> None:
        self._inner = inner
        self._calls = calls

    def writelines(self, buffers: Any) -> None:
        buffers = list(buffers)
        self._calls.append(len(buffers))
        self._inner.writelines(buffers)

    def write(self, data: Any) -> None:
        self._calls.append(1)
        self._inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The server connection's calls that hand its transport bytes (buffers in each)."""
    calls: list[int] = []
    inner = tcp._ClientProtocol.connection_made

    def made(self: Any, transport: Any) -> None:
        inner(self, transport)
        self.transport = _Counting(self.transport, calls)

    monkeypatch.setattr(tcp._ClientProtocol, "connection_made", made)
    return calls


def _produce(data: bytes) -> ProduceRequest:
    return ProduceRequest(partitions=[ProducePartition("t", 0, len(data))])


def test_the_answers_one_group_commit_settles_go_out_in_one_write(
    tmp_path: Path, writes: list[int]
) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=ALWAYS))
            held = HeldExecutor()
            loop = asyncio.get_running_loop()
            set_flush_executor(loop, held)  # the group commit waits for the test
            try:
                plog = broker.logs.logs[("t", 0)]
                data = [batch([f"v{i}".encode()]) for i in range(5)]
                corrs = [c.send(_produce(d), [d]) for d in data]
                await c.writer.drain()
                for _ in range(500):  # bounded: all five appended, their commit asked for
                    if plog.log_end_offset == 5 and held.jobs:
                        break
                    await asyncio.sleep(0.01)
                assert plog.log_end_offset == 5
                writes.clear()
                held.run_all()  # one group commit covers all five
                offsets = []
                for corr in corrs:
                    body = (await c.response(corr)).body
                    assert isinstance(body, ProduceResponse)
                    offsets.append(body.results[0].base_offset)
                assert offsets == [0, 1, 2, 3, 4]
                assert len(writes) == 1  # five answers, one write
            finally:
                set_flush_executor(loop, None)
                held.run_all()

    asyncio.run(main())


def test_a_commits_answers_leave_in_the_loop_callback_that_settles_them(
    tmp_path: Path, writes: list[int]
) -> None:
    """The answers a group commit settles are written before the loop callback that took its
    result back returns (at the end of its step, :mod:`tidewire._step`), not in a later
    callback behind the requests read in between."""

    async def main() -> None:
        async with _commits_held(tmp_path) as (_, server, c, plog, held):
            first = await _second_behind_first(c, plog, held)
            (conn,) = server.connections
            inner = plog._flush_finished
            after: list[tuple[int, int]] = []

            def finished(*a: Any) -> None:
                writes.clear()
                inner(*a)
                after.append((len(conn._held), len(writes)))

            plog._flush_finished = finished
            held.jobs.pop(0)()  # the first commit: the second request still waits
            await _until(lambda: bool(after))
            assert after[0] == (0, 1)  # nothing left held: its answer written in the step
            body = (await c.response(first)).body
            assert isinstance(body, ProduceResponse)
            assert body.results[0].base_offset == 0

    asyncio.run(main())


def test_an_error_frame_comes_after_the_answers_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with _commits_held(tmp_path) as (_, server, c, plog, held):
            first = await _second_behind_first(c, plog, held)
            # Held answers stay held: only what is written after them may send them.
            monkeypatch.setattr(tcp.TcpServer, "hold", lambda self, conn: None)
            held.jobs.pop(0)()  # the first commit: its answer is held (b still waits)
            (conn,) = server.connections
            await _until(lambda: bool(conn._held))
            conn.go_away()
            body = (await c.response(first)).body
            assert isinstance(body, ProduceResponse)
            assert body.results[0].base_offset == 0
            event = await c.next_event()  # then the error frame, then the close
            assert getattr(event, "error", None) is not None

    asyncio.run(main())


def test_a_lone_answer_is_written_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=ALWAYS))
            (conn,) = server.connections
            held: list[int] = []
            inner = conn._write_held
            conn._write_held = lambda buffers: (held.append(1), inner(buffers))  # type: ignore[method-assign]
            for i in range(3):  # one at a time: nothing else of this connection waits
                d = batch([f"v{i}".encode()])
                body = (await c.rpc(_produce(d), [d])).body
                assert body.results[0].base_offset == i
            assert held == []

    asyncio.run(main())


@contextlib.asynccontextmanager
async def _commits_held(
    tmp_path: Path, **serve_options: Any
) -> AsyncIterator[tuple[Any, Any, Client, Any, HeldExecutor]]:
    """A broker and a client, topic ``t`` (``always``) made, and every group commit held
    until the test runs it: (broker, server, client, t's log, the held commits)."""
    async with serve(tmp_path, **serve_options) as (broker, server), Client.connect(server) as c:
        await c.call(CreateTopicRequest(name="t", config=ALWAYS))
        held = HeldExecutor()
        loop = asyncio.get_running_loop()
        set_flush_executor(loop, held)
        try:
            yield broker, server, c, broker.logs.logs[("t", 0)], held
        finally:
            set_flush_executor(loop, None)
            held.run_all()


async def _until(ok: Any) -> None:
    for _ in range(500):  # bounded
        if ok():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached within 5 s")


async def _second_behind_first(c: Client, plog: Any, held: HeldExecutor) -> int:
    """Produce ``a``, then, while its group commit is held, ``b`` (appended, waiting for the
    next commit); return the first request's correlation id."""
    a, b = batch([b"a"]), batch([b"b"])
    first = c.send(_produce(a), [a])
    await c.writer.drain()
    await _until(lambda: plog.log_end_offset == 1 and len(held.jobs) == 1)
    c.send(_produce(b), [b])
    await c.writer.drain()
    await _until(lambda: plog.log_end_offset == 2)
    return first


def test_a_fetch_waiting_for_room_behind_held_answers_is_woken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held answers count as unsent: a fetch task that meets them in ``_reserve_output``
    (the group commit's result and the fetch's read in one loop turn) must be woken when they
    leave, or it waits for a release that never comes (here: a 300 ms long-poll). A commit's
    answers leave at the end of its step; answers settled outside a step (a truncation's,
    say) wait for the loop's next callback, as every answer here does."""
    monkeypatch.setattr(_step, "defer", lambda fn: False)

    async def main() -> None:
        async with _commits_held(tmp_path, max_unsent_bytes=1024) as (_, server, c, plog, held):
            await c.call(CreateTopicRequest(name="u"))
            p1 = await _second_behind_first(c, plog, held)
            (conn,) = server.connections
            inner_fetch_now = conn._fetch_now

            def fetch_now(ev: Any) -> Any:
                held.jobs.pop(0)()  # the commit's result first, in the fetch's turn
                return inner_fetch_now(ev)

            conn._fetch_now = fetch_now
            # The task's case: a fetch parked without a task checks for room as it answers.
            conn._park_fetch = lambda ev, body: False
            inner_reserve = conn._reserve_output
            met_held: list[int] = []

            async def reserve(size: int) -> None:
                met_held.append(len(conn._held))
                await inner_reserve(size)

            conn._reserve_output = reserve
            f = c.send(
                FetchRequest(
                    partitions=[FetchPartition("u", 0, 0, 1024)],
                    max_wait_ms=300,
                    min_bytes=1,
                    max_bytes=1024,
                )
            )
            await c.writer.drain()
            assert isinstance((await c.response(p1, timeout=3)).body, ProduceResponse)
            assert isinstance((await c.response(f, timeout=3)).body, FetchResponse)
            assert met_held  # the case: it met held answers
            assert met_held[0] > 0

    asyncio.run(main())
