"""An in-process TCP proxy for fault injection between cluster nodes (and etcd): it forwards
each connection to its target and, on command, delays, drops, cuts or partitions.

- ``delay_s``: every chunk is held that long before it is forwarded (order kept);
- ``blackhole()``: chunks are read and thrown away (a partition as the peer sees it: writes
  succeed, nothing arrives, nothing is answered), new connections are accepted and starve;
- ``refuse()``: new connections are closed at once and current ones are cut;
- ``cut()``: every current connection is reset, new ones go through;
- ``heal()``: back to forwarding.

Each proxy is one direction of one link (a node's outgoing connections to one peer); a test
builds a full mesh of them and partitions by turning some to ``blackhole``. Runs on the test's
event loop; every socket is closed by :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Literal

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

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def blackhole(self) -> None:
        self.mode = "blackhole"

    def refuse(self) -> None:
        self.mode = "refuse"
        self.cut()

    def heal(self) -> None:
        self.mode = "forward"
        self.delay_s = 0.0

    def cut(self) -> None:
        """Reset every current connection (both sides see it closed)."""
        for a, b in list(self._pairs):
            for w in (a, b):
                _reset(w)
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            _reset(writer)
            return
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        pair = (writer, up_w)
        self._pairs.add(pair)
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
                if self.mode == "blackhole":
                    continue
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.mode != "forward" or pair not in self._pairs:
                    continue
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if pair in self._pairs:
                self._pairs.discard(pair)
                for w in pair:
                    w.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (SO_LINGER 0), as a broken network or a killed peer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
    writer.close()
