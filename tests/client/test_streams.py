"""Lightweight streams through both clients against a real broker: send and receive
(work-queue), receive_many over many streams in one request, send_many in requests of at
most 10,000 items with per-item results, reads by token, list, describe and stats."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.client._support import KINDS, PROMPT_S, Twin, addr, connect, in_thread, run, serve
from tidewire.client import (
    FROM_END,
    FROM_START,
    AsyncClient,
    SendItem,
    StreamInfo,
)
from tidewire.client._streams import DUPLICATE, SEND_PIPELINE
from tidewire.errors import InvalidStreamError, StreamFullError
from tidewire.protocol.messages import MAX_SEND_ITEMS


class Streams:
    """``client.streams`` of a :class:`Twin`, every method awaitable."""

    def __init__(self, twin: Twin) -> None:
        self.streams = twin.client.streams
        self.blocking = not isinstance(twin.client, AsyncClient)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.streams, name)
        if self.blocking:
            return functools.partial(in_thread, method)
        return method  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", KINDS)
def test_send_then_receive_takes_each_message_once(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            s = Streams(c)
            r = await s.send("user/42", b"one")
            assert (r.code, r.token) == (0, "")  # in memory: no token
            await s.send("user/42", "two")
            got = await s.receive("user/42")
            assert got is not None
            assert (got.stream, got.value, got.token) == ("user/42", b"one", "")
            assert got.expires_at_ms > got.timestamp_ms > 0
            got = await s.receive("user/42", wait_ms=10)
            assert got is not None
            assert got.value == b"two"
            assert await s.receive("user/42", wait_ms=10) is None  # taken: nothing left

    run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_receive_many_waits_on_many_streams_in_one_request(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path) as (broker, server),
            connect(kind, server) as c,
            connect("async", server) as sender,
        ):
            names = [f"job/{i}" for i in range(500)]
            waiting = asyncio.ensure_future(
                Streams(c).receive_many(names, max_messages=5, wait_ms=20_000)
            )

            async def until_waiting() -> None:
                while broker.streams.stats().receivers < 1:
                    await asyncio.sleep(0.001)

            await asyncio.wait_for(until_waiting(), PROMPT_S)
            await Streams(sender).send("job/321", b"work")
            got = await asyncio.wait_for(waiting, PROMPT_S)  # well before its 20 s
            assert [(m.stream, m.value) for m in got] == [("job/321", b"work")]

    run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_send_many_cuts_requests_and_returns_a_result_per_item(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), connect(kind, server) as c:
            s = Streams(c)
            n = 2 * MAX_SEND_ITEMS + 500
            items: list[SendItem | tuple[Any, ...]] = [
                SendItem(f"dev/{i}", str(i).encode()) for i in range(n)
            ]
            items[7] = ("", b"no stream id")  # a per-item error
            items[8] = ("dev/8", b"first", "uuid-8")
            items[9] = ("dev/8", b"again", "uuid-8")  # a duplicate of the one before
            results = await s.send_many(items)
            assert len(results) == n
            assert results[7].code == InvalidStreamError.code
            assert "non-empty" in results[7].message
            assert (results[8].code, results[9].code) == (0, DUPLICATE)
            assert all(r.code == 0 for i, r in enumerate(results) if i not in (7, 9))
            assert broker.streams.stats().sent_in_memory == n - 2
            got = await s.receive_many(["dev/8"], max_messages=10)
            assert [m.value for m in got] == [b"first"]

    run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_send_many_without_tokens(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            s = Streams(c)
            items = [SendItem(f"t/{i}", b"v", persistent=True) for i in range(3)]
            bare = await s.send_many(items, tokens=False)
            assert [(r.code, r.token) for r in bare] == [(0, "")] * 3
            full = await s.send_many(items)
            assert all(r.code == 0 and r.token for r in full)
            msgs, _ = await s.read({"t/1": FROM_START})
            assert [m.value for m in msgs] == [b"v", b"v"]  # both stored, only tokens differ

    run(main())


def test_send_many_has_several_requests_in_flight(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            sizes: list[int] = []
            in_flight = most = 0
            inner = c.streams._send

            async def tracked(items: list[SendItem], ring: int, block: int, tokens: bool) -> Any:
                nonlocal in_flight, most
                sizes.append(len(items))
                in_flight += 1
                most = max(most, in_flight)
                try:
                    return await inner(items, ring, block, tokens)
                finally:
                    in_flight -= 1

            c.streams._send = tracked  # type: ignore[method-assign]
            results = await c.streams.send_many((f"s/{i}", b"x") for i in range(5 * MAX_SEND_ITEMS))
            assert len(results) == 5 * MAX_SEND_ITEMS
            assert sizes == [MAX_SEND_ITEMS] * 5
            assert most == SEND_PIPELINE  # pipelined, and no more than the bound

    run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_send_raises_the_error_of_its_item(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, stream_max_ttl_ms=60_000, stream_default_ttl_ms=10_000) as (_, server),
            connect(kind, server) as c,
        ):
            s = Streams(c)
            with pytest.raises(InvalidStreamError, match="at most 1,024"):
                await s.send("x" * 1025, b"v")
            with pytest.raises(InvalidStreamError, match="60,000"):
                await s.send("t", b"v", ttl_ms=60_001)
            # a ring of one with a blocking send: the second waits for room, then fails
            await s.send("full", b"a", ring_size=1)
            with pytest.raises(StreamFullError):
                await s.send("full", b"b", block_ms=20)
            got = await s.receive("full")
            assert got is not None
            assert got.value == b"a"

    run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_read_by_token_misses_and_repeats_nothing(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            s = Streams(c)
            first = await s.send("audit", b"m0", persistent=True)
            assert first.token
            for i in range(1, 5):
                await s.send("audit", f"m{i}".encode(), persistent=True)
            await s.send("audit", b"in memory only")  # not readable by token
            got, tokens = await s.read({"audit": FROM_START, "empty": FROM_START}, max_messages=2)
            assert [m.value for m in got] == [b"m0", b"m1"]
            assert set(tokens) == {"audit", "empty"}
            assert tokens["audit"] == got[-1].token
            rest, tokens2 = await s.read({"audit": tokens["audit"]})
            assert [m.value for m in rest] == [b"m2", b"m3", b"m4"]
            # the send's token reads from that message; a read leaves it in place
            again, _ = await s.read({"audit": first.token}, max_messages=1)
            assert [m.value for m in again] == [b"m0"]
            # nothing more: the token stays where it is
            none, tokens3 = await s.read({"audit": tokens2["audit"]}, wait_ms=10)
            assert none == []
            assert tokens3["audit"] == tokens2["audit"]
            # from the end: only what comes after
            end, tokens4 = await s.read({"audit": FROM_END}, wait_ms=10)
            assert end == []
            await s.send("audit", b"m5", persistent=True)
            new, _ = await s.read({"audit": tokens4["audit"]})
            assert [m.value for m in new] == [b"m5"]
            with pytest.raises(InvalidStreamError, match="another stream"):
                await s.read({"other": first.token})

    run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_list_describe_and_stats(tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), connect(kind, server) as c:
            s = Streams(c)
            await s.send_many((f"page/{i:05d}", b"x") for i in range(2_500))
            await s.send("other", b"y", persistent=True)
            listed: list[StreamInfo] = await s.list("page/", limit=5_000)
            assert [i.stream for i in listed] == [f"page/{i:05d}" for i in range(2_500)]
            few = await s.list("page/", limit=3)
            assert [i.stream for i in few] == ["page/00000", "page/00001", "page/00002"]
            info = await s.describe("other")
            assert info is not None
            assert (info.stream, info.waiting, info.persistent, info.in_memory) == (
                "other",
                1,
                1,
                0,
            )
            assert await s.describe("never") is None
            stats = await s.stats()
            assert stats.streams == 2_501
            assert (stats.sent_in_memory, stats.sent_persistent) == (2_500, 1)

    run(main())


def test_bad_arguments_name_their_numbers(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            with pytest.raises(InvalidStreamError, match="max_messages=0"):
                await c.streams.receive_many(["a"], max_messages=0)
            with pytest.raises(InvalidStreamError, match="no stream named"):
                await c.streams.receive_many([])
            with pytest.raises(InvalidStreamError, match="ring_size=-5"):
                await c.streams.send("a", b"v", ring_size=-5)
            with pytest.raises(InvalidStreamError, match="not a resume token"):
                await c.streams.read({"a": "!!"})
            with pytest.raises(TypeError, match="stream, value"):
                await c.streams.send_many([("only-a-stream",)])

    run(main())


def test_sends_of_one_loop_turn_share_a_request(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            calls = [c.streams.send(f"many/{i}", b"v") for i in range(300)]
            calls.append(c.streams.send("", b"bad"))
            calls.append(c.streams.send("other-settings", b"v", block_ms=5))
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert all(getattr(r, "code", None) == 0 for r in outcomes[:300])
            assert isinstance(outcomes[300], InvalidStreamError)  # only its own error
            assert getattr(outcomes[301], "code", None) == 0
            assert c.streams._coalescer.requests == 2  # one per settings, not one per call
            assert broker.streams.stats().streams == 301

    run(main())
