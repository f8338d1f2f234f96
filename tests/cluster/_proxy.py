"""An in-process TCP proxy for fault injection between cluster nodes (and etcd): it forwards
each connection to its target and, on command, delays, drops, cuts or partitions.

- ``delay_s``: every chunk is held that long before it is forwarded (order kept);
- ``blackhole()``: chunks are read and thrown away (a partition as the peer sees it: writes
  succeed, nothing arrives, nothing is answered), new connections are accepted and starve;
- ``refuse()``: new connections are closed at once and current ones are cut;
- ``cut()``: every current connection is reset, new ones go through;
- ``heal()``: back to forwarding;
- ``isolate()``: blackhole every connection but those opened by this (the test's) process, so
  a node's peers lose it while the test's own clients still reach it; ``rejoin()`` ends it the
  way a real network heals: the connections whose bytes were thrown away are reset (TCP would
  have resent them or timed out; resuming mid-stream would be garbage no network makes).

Each proxy is one direction of one link (a node's outgoing connections to one peer); a test
builds a full mesh of them and partitions by turning some to ``blackhole``. Runs on the test's
event loop, or on a :class:`ProxyHost`'s own thread when the test blocks its loop (starting a
node process waits for its first line, and the node reaches etcd through a proxy first);
every socket is closed by :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal, TypeVar

from tidewire.server.listening import close_listener

T = TypeVar("T")

Mode = Literal["forward", "blackhole", "refuse"]


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode: Mode = "forward"
        self.delay_s = 0.0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        #: In ``blackhole`` mode, forward the connections this process opened.
        self.pass_local = False
        self._local: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._dropped: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._closed = False

    def is_closed(self) -> bool:
        """Whether :meth:`close` was called (a call: checked again after an await)."""
        return self._closed

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Close the listener and every connection, and wait for every task: a connection
        being accepted (its own task, opening the way upstream) included, which would
        otherwise finish after this and leave its sockets to the garbage collector."""
        self._closed = True
        if self._server is not None:
            close_listener(self._server)
        self.cut()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            # Bounded: it waits for every connection the server handed out to close too.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def blackhole(self) -> None:
        self.mode = "blackhole"

    def refuse(self) -> None:
        self.mode = "refuse"
        self.cut()

    def heal(self) -> None:
        self.mode = "forward"
        self.pass_local = False
        self.delay_s = 0.0

    def isolate(self) -> None:
        """Blackhole the connections of other processes; forward this process's own."""
        self.pass_local = True
        self.mode = "blackhole"

    def rejoin(self) -> None:
        """Forward again; reset the connections that had bytes thrown away."""
        dropped, self._dropped = self._dropped, set()
        self.heal()
        for pair in dropped:
            if pair in self._pairs:
                self._pairs.discard(pair)
                for w in pair:
                    _reset(w)

    def cut(self) -> None:
        """Reset every current connection (both sides see it closed)."""
        for a, b in list(self._pairs):
            for w in (a, b):
                _reset(w)
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse" or self.is_closed():
            _reset(writer)
            return
        # asyncio runs this in a task of its own; close() cancels and waits for it.
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        except asyncio.CancelledError:
            # Cancelled by close(): the accepted socket is this task's. Ended, not re-raised:
            # asyncio 3.11's stream protocol asks its connection task for its exception,
            # which for a cancelled task raises and logs a traceback (close() waits for it).
            _reset(writer)
            return
        if self.is_closed():  # close() ran while the way upstream opened
            _reset(writer)
            _reset(up_w)
            return
        pair = (writer, up_w)
        self._pairs.add(pair)
        peer = writer.get_extra_info("peername")
        if peer is not None and peer[1] in _own_ports():
            self._local.add(pair)
        for src, dst in ((reader, up_w), (up_r, writer)):
            t = asyncio.create_task(self._pump(src, dst, pair))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while chunk := await src.read(65536):
                if self._blocked(pair):
                    self._dropped.add(pair)
                    continue
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self._blocked(pair) or self.mode == "refuse" or pair not in self._pairs:
                    self._dropped.add(pair)
                    continue
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._local.discard(pair)
            self._dropped.discard(pair)
            if pair in self._pairs:
                self._pairs.discard(pair)
                for w in pair:
                    w.close()

    def _blocked(self, pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> bool:
        return self.mode == "blackhole" and not (self.pass_local and pair in self._local)


def _own_ports() -> set[int]:
    """The local TCP ports of this process's sockets (from /proc: its socket inodes matched
    with /proc/net/tcp's), to tell the test's own connections from the nodes'."""
    inodes: set[str] = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


class ProxyHost:
    """Proxies on an event loop of their own thread: for a test whose loop blocks (it waits
    for a started node's first line while the node reaches etcd through a proxy). Changes of
    mode go through :meth:`do`, run on that loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.proxies: list[Proxy] = []

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def add(self, host: str, port: int) -> Proxy:
        proxy = self._run(Proxy(host, port).start())
        self.proxies.append(proxy)
        return proxy

    def do(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` (e.g. ``proxy.isolate``) on the proxies' loop and wait for it."""

        async def call() -> None:
            fn()

        self._run(call())

    def close(self) -> None:
        async def close_all() -> None:
            await asyncio.gather(*(p.close() for p in self.proxies), return_exceptions=True)
            # Anything else still running here would be abandoned with the loop (its
            # sockets left to the garbage collector): cancel it and let it finish.
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await asyncio.sleep(0)  # the closed sockets' last callbacks

        with contextlib.suppress(Exception):
            self._run(close_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (SO_LINGER 0), as a broken network or a killed peer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
    # abort, not close: a close waits for the write buffer to drain, which a peer that
    # stopped reading never lets happen, and the socket would outlive the proxy.
    writer.transport.abort()
