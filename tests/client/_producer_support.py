"""Helpers of the producer and consumer tests: both producers behind one awaitable interface
(:class:`ProducerTwin`), both consumers likewise (:class:`ConsumerTwin`), a TCP proxy that
cuts connections at chosen moments (:class:`CuttingProxy`), and readers of what a broker
stored (records and batch headers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from tests.client._support import PROMPT_S, in_thread
from tidewire.broker import Broker
from tidewire.client import (
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    ConsumerRecord,
    Producer,
    RecordMetadata,
)
from tidewire.protocol.messages import ApiKey
from tidewire.records import BatchHeader, Record, iter_batches, iter_records


class ProducerTwin:
    """An :class:`AsyncProducer` or a :class:`Producer` with awaitable methods: the blocking
    one's calls each run in a thread of their own."""

    def __init__(self, kind: str, address: str, **options: Any) -> None:
        self.kind = kind
        self.p: AsyncProducer | Producer
        self.p = (
            AsyncProducer(address, **options) if kind == "async" else Producer(address, **options)
        )

    async def send(self, topic: str, value: bytes | None, **kw: Any) -> Any:
        """Queue one message; returns its future (either kind)."""
        if isinstance(self.p, AsyncProducer):
            return await self.p.send(topic, value, **kw)
        return await in_thread(self.p.send, topic, value, **kw)

    async def send_many(self, topic: str, messages: list[dict[str, Any]]) -> list[Any]:
        """Queue every message (``value`` and the keywords of ``send``) from one caller."""
        if isinstance(self.p, AsyncProducer):
            return [await self.p.send(topic, **m) for m in messages]
        sync = self.p
        return await in_thread(lambda: [sync.send(topic, **m) for m in messages])

    async def result(self, fut: Any, timeout: float = PROMPT_S) -> RecordMetadata:
        if self.kind == "async":
            return await asyncio.wait_for(fut, timeout)  # type: ignore[no-any-return]
        return await in_thread(fut.result, timeout)  # type: ignore[no-any-return]

    async def results(self, futs: list[Any], timeout: float = PROMPT_S) -> list[RecordMetadata]:
        if self.kind == "async":
            return list(await asyncio.wait_for(asyncio.gather(*futs), timeout))
        return await in_thread(lambda: [f.result(timeout) for f in futs])

    async def flush(self, timeout_s: float | None = PROMPT_S) -> None:
        if isinstance(self.p, AsyncProducer):
            await self.p.flush(timeout_s)
        else:
            await in_thread(self.p.flush, timeout_s)

    async def close(self, **kw: Any) -> None:
        if isinstance(self.p, AsyncProducer):
            await self.p.close(**kw)
        else:
            await in_thread(self.p.close, **kw)


@contextlib.asynccontextmanager
async def producing(kind: str, address: str, **options: Any) -> AsyncIterator[ProducerTwin]:
    twin = ProducerTwin(kind, address, **options)
    try:
        yield twin
    finally:
        await twin.close(flush=False)


class ConsumerTwin:
    """An :class:`AsyncConsumer` or a :class:`Consumer` with awaitable methods."""

    def __init__(self, kind: str, address: str, **options: Any) -> None:
        self.kind = kind
        self.c: AsyncConsumer | Consumer
        self.c = (
            AsyncConsumer(address, **options) if kind == "async" else Consumer(address, **options)
        )

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.c, name)
        if isinstance(self.c, AsyncConsumer) or name in ("position", "assignment"):
            return method  # type: ignore[no-any-return]
        return lambda *a, **kw: in_thread(method, *a, **kw)

    async def take(self, n: int) -> list[ConsumerRecord]:
        """The next ``n`` records by iteration (bounded by PROMPT_S)."""
        if isinstance(self.c, AsyncConsumer):
            aconsumer = self.c

            async def take() -> list[ConsumerRecord]:
                out: list[ConsumerRecord] = []
                async for r in aconsumer:
                    out.append(r)
                    if len(out) == n:
                        break
                return out

            return await asyncio.wait_for(take(), PROMPT_S)
        consumer = self.c

        def take_sync() -> list[ConsumerRecord]:
            out: list[ConsumerRecord] = []
            for r in consumer:
                out.append(r)
                if len(out) == n:
                    break
            return out

        return await asyncio.wait_for(in_thread(take_sync), PROMPT_S)


@contextlib.asynccontextmanager
async def consuming(kind: str, address: str, **options: Any) -> AsyncIterator[ConsumerTwin]:
    twin = ConsumerTwin(kind, address, **options)
    try:
        yield twin
    finally:
        await twin.close()


# --- what the broker stored -----------------------------------------------------------------------


async def stored(
    broker: Broker, topic: str, partition: int
) -> tuple[list[BatchHeader], list[Record]]:
    """Every batch header and record of one partition, read from the broker directly."""
    (result,) = await broker.fetch([(topic, partition, 0, 1 << 30)], max_bytes=1 << 30)
    headers: list[BatchHeader] = []
    records: list[Record] = []
    view = memoryview(result.data)
    for pos, h in iter_batches(view):
        headers.append(h)
        records.extend(iter_records(view[pos : pos + h.size]))
    return headers, records


# --- a proxy that cuts connections ----------------------------------------------------------------


class CuttingProxy:
    """A TCP proxy on 127.0.0.1, port 0, in front of ``target``. It forwards bytes both ways
    and, while :attr:`cut_responses` is above zero, closes both sides of a connection instead
    of forwarding a response frame of API :attr:`api` (counting down). So the broker has done
    the work, but the client never hears of it.

    Attributes:
        cuts: connections cut so far.
        connections: connections accepted so far.
    """

    def __init__(self, target_port: int, *, api: int = ApiKey.PRODUCE, cut_responses: int = 0):
        self.target_port = target_port
        self.api = api
        self.cut_responses = cut_responses
        self.cuts = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def addr(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def cut_all(self) -> None:
        """Close every open connection now."""
        for w in list(self._writers):
            w.close()

    async def _pipe_up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        writer.close()

    async def _pipe_down(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        other: asyncio.StreamWriter,
    ) -> None:
        """Server to client, frame by frame."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readexactly(18)
                length = int.from_bytes(head[:4], "big")
                rest = await reader.readexactly(length + 4 - 18)
                api = int.from_bytes(head[6:8], "big", signed=True)
                if api == self.api and self.cut_responses > 0:
                    self.cut_responses -= 1
                    self.cuts += 1
                    break
                writer.write(head + rest)
                await writer.drain()
        writer.close()
        other.close()

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {cwriter, swriter}
        try:
            await asyncio.gather(
                self._pipe_up(creader, swriter), self._pipe_down(sreader, cwriter, swriter)
            )
        finally:
            self._writers -= {cwriter, swriter}

    def _track(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(r, w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._track, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut_all()
        if self._tasks:
            await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), PROMPT_S)
        await self._server.wait_closed()
