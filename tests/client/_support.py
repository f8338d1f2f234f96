"""Shared helpers of the client tests: a real broker and server on port 0 that are always
stopped, both clients behind one awaitable interface (:class:`Twin`), and stand-in servers
whose behaviour a test controls (one that answers only when told, one that never reads, a
port that refuses connections).

Every test runs its own event loop (``asyncio.run``, through :func:`run`), and the broker's
server runs on it. The blocking :class:`~tidewire.client.Client` is called from threads of
their own, so the loop (and the server) keeps running while a call blocks. Nothing sleeps
except where a timeout is the thing under test; whatever should happen promptly is bounded
by :data:`PROMPT_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient, Client, FetchedRecords
from tidewire.protocol import NEED_DATA, Connection, ConnectionClosed, RequestReceived, Role
from tidewire.protocol.messages import PingResponse
from tidewire.records import Record
from tidewire.security.config import SecurityConfig
from tidewire.security.credentials import Credentials
from tidewire.security.model import Acl
from tidewire.server import ServerConfig, TcpServer

#: The two clients every conformance test runs against.
KINDS = ("async", "sync")
#: Record timestamps sit around this (ms since the epoch).
T0 = 1_700_000_000_000
#: The bound on anything that should happen at once (s): generous for a loaded CI machine,
#: far below the 30 s long-polls and request timeouts these tests would otherwise sit out.
PROMPT_S = 5.0
#: A long-poll's max wait (ms) that no test should ever sit out.
LONG_POLL_MS = 30_000
#: Tiny timeouts for the tests whose subject is a timeout (s).
TINY_TIMEOUT_S = 0.1
#: The bound on a whole test (s): a hung client fails its test instead of the run.
TEST_BOUND_S = 30.0

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a test's coroutine on a fresh event loop, bounded by :data:`TEST_BOUND_S`."""
    return asyncio.run(asyncio.wait_for(main, TEST_BOUND_S))


def addr(server: TcpServer) -> str:
    return f"127.0.0.1:{server.port}"


# --- the broker and its server -------------------------------------------------------------------


@contextlib.asynccontextmanager
async def broker_at(tmp_path: Path, **config: Any) -> AsyncIterator[Broker]:
    """A started broker over ``tmp_path/data``, closed on the way out."""
    async with Broker(BrokerConfig(data_dir=str(tmp_path / "data"), **config)) as broker:
        yield broker


@contextlib.asynccontextmanager
async def listening(broker: Broker, port: int = 0, **config: Any) -> AsyncIterator[TcpServer]:
    """A started server for ``broker`` on 127.0.0.1, closed on the way out. The close does
    not wait for requests still running: a long-poll left behind must not hold up a test."""
    server = TcpServer(broker, ServerConfig(host="127.0.0.1", port=port, **config))
    await server.start()
    try:
        yield server
    finally:
        await server.close(grace_s=0)


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **broker_config: Any) -> AsyncIterator[tuple[Broker, TcpServer]]:
    """A broker and its server on port 0, both stopped on the way out."""
    async with broker_at(tmp_path, **broker_config) as broker, listening(broker) as server:
        yield broker, server


async def until_waiting(broker: Broker, fetches: int) -> None:
    """Return once ``fetches`` long-poll fetches wait in the broker (bounded by PROMPT_S).

    It reads the broker's private waiter count: with the blocking client the fetches are sent
    from other threads, so no ordering of requests on the test's side can tell when they got
    there. It only yields to the loop; it never sleeps.
    """

    async def poll() -> None:
        while broker._n_waiters < fetches:
            await asyncio.sleep(0)

    await asyncio.wait_for(poll(), PROMPT_S)


# --- the two clients behind one interface --------------------------------------------------------


async def in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call the blocking ``fn`` in a daemon thread of its own and await its outcome.

    Unlike ``asyncio.to_thread`` the thread belongs to no executor, so a call that never
    returns (a client bug) fails its test through :func:`run`'s bound instead of hanging the
    loop's shutdown; and any number of calls run at once.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def deliver(result: T | None, error: Exception | None) -> None:
        if fut.done():  # the test stopped waiting
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            outcome: tuple[T | None, Exception | None] = (fn(*args, **kwargs), None)
        except Exception as exc:  # handed to the awaiting test as is
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the test's loop is closed: nobody waits
            loop.call_soon_threadsafe(deliver, *outcome)

    thread = threading.Thread(target=work, name=f"twin {fn.__name__}", daemon=True)
    thread.start()
    try:
        return await fut
    finally:
        if fut.done() and not fut.cancelled():
            # It has delivered and is returning: wait, so that nothing it held (an
            # exception and its frames) outlives the call.
            thread.join(PROMPT_S)


class Twin:
    """An :class:`AsyncClient` or a :class:`Client` with awaitable methods of the same names:
    the async client's as they are, each of the blocking client's in a thread of its own."""

    def __init__(self, kind: str, address: str, **kwargs: Any) -> None:
        self.kind = kind
        self.client: AsyncClient | Client
        if kind == "async":
            self.client = AsyncClient(address, **kwargs)
        elif kind == "sync":
            self.client = Client(address, **kwargs)
        else:
            raise ValueError(f"kind {kind!r} is not one of {KINDS}")

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.client, name)
        if isinstance(self.client, AsyncClient):
            return method  # type: ignore[no-any-return]
        return functools.partial(in_thread, method)

    def __repr__(self) -> str:
        return f"Twin({self.kind})"


@contextlib.asynccontextmanager
async def connect(kind: str, server: TcpServer | str, **kwargs: Any) -> AsyncIterator[Twin]:
    """A client of ``kind`` for ``server`` (or a ``HOST:PORT``), closed on the way out."""
    twin = Twin(kind, server if isinstance(server, str) else addr(server), **kwargs)
    try:
        yield twin
    finally:
        await twin.close()


async def read_all(c: Twin, topic: str, partition: int, offset: int = 0, **kw: Any) -> list[Record]:
    """Fetch one partition from ``offset`` to its high watermark, one fetch after another."""
    out: list[Record] = []
    while True:
        got: FetchedRecords = await c.fetch(topic, partition, offset, **kw)
        if not got.records:
            assert got.next_offset == offset == got.high_watermark
            return out
        assert [r.offset for r in got.records] == list(range(offset, got.next_offset))
        out.extend(got.records)
        offset = got.next_offset


# --- stand-in servers ----------------------------------------------------------------------------


class FakeBroker:
    """A server on 127.0.0.1, port 0, that speaks the protocol through a server-side
    :class:`Connection` and answers pings (only pings) -- when the test lets it.

    Attributes:
        hold: how many of the next requests to leave unanswered (until :meth:`release`).
        connections: connections accepted so far.
        max_outstanding: the most requests a client had sent without an answer, as seen when
            the fake finished reading what had arrived (it answers only then).
    """

    def __init__(self) -> None:
        self.hold = 0
        self.connections = 0
        self.max_outstanding = 0
        self._held: list[tuple[asyncio.StreamWriter, Connection, int]] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def held(self) -> int:
        return len(self._held)

    def release(self) -> None:
        """Answer every request held so far (late, as far as their clients are concerned)."""
        held, self._held = self._held, []
        for writer, conn, corr in held:
            if not writer.is_closing():
                writer.writelines(conn.send_response(corr, PingResponse()))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        conn = Connection(Role.SERVER)
        answers: list[int] = []
        try:
            while True:
                event = conn.next_event()
                if event is NEED_DATA:
                    self.max_outstanding = max(self.max_outstanding, conn.in_flight)
                    for corr in answers:
                        writer.writelines(conn.send_response(corr, PingResponse()))
                    answers.clear()
                    try:
                        chunk = await reader.read(65536)
                    except OSError:
                        chunk = b""
                    conn.receive_data(chunk)
                elif isinstance(event, ConnectionClosed):
                    return
                else:
                    assert isinstance(event, RequestReceived), event
                    if self.hold > 0:
                        self.hold -= 1
                        self._held.append((writer, conn, event.correlation_id))
                    else:
                        answers.append(event.correlation_id)
        finally:
            writer.close()
            self._writers.discard(writer)
            self._tasks.discard(task)

    async def __aenter__(self) -> FakeBroker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await asyncio.wait_for(asyncio.gather(*self._tasks), PROMPT_S)
        await self._server.wait_closed()


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections: bound (so nobody else takes it) but not
    listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@contextlib.contextmanager
def deaf_listener() -> Iterator[int]:
    """A port on 127.0.0.1 whose connections complete (the kernel's backlog accepts them) but
    are never accepted nor read: what a client writes only fills the socket buffers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def secured(
    tmp_path: Path, bob_acls: tuple[Acl, ...] = ()
) -> AsyncIterator[tuple[Broker, str, Credentials, Credentials]]:
    """A broker with authentication on and a listener: the broker, its address, the first
    superuser's credentials and those of the user bob, who holds ``bob_acls`` only."""
    config = SecurityConfig(authentication=True, superusers="admin")
    broker = Broker(BrokerConfig(str(tmp_path / "data")), security=config)
    await broker.start()
    server = TcpServer(broker, ServerConfig(port=0))
    await server.start()
    try:
        assert broker.bootstrap_key_file is not None
        admin = Credentials(broker.bootstrap_key_file.read_text().strip())
        await broker.security.create_principal("bob")
        _, key = await broker.security.create_key("bob")
        if bob_acls:
            await broker.security.add_acls(bob_acls)
        yield broker, f"127.0.0.1:{server.port}", admin, Credentials(key)
    finally:
        await server.close(grace_s=0)
        await broker.close()
