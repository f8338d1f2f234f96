"""One ``send()`` per answer: uvicorn's httptools protocol with its writes coalesced.

uvicorn writes an answer's status line and headers, then its body, as two transport writes;
asyncio sends each at once, so every small answer costs two ``send`` system calls, which
measured about a third of the broker's CPU under a publish load. :class:`CoalescingProtocol`
gives the protocol a transport that gathers the writes made in one turn of the event loop
and sends them together at the end of it (one ``call_soon``), or at once when they reach
:data:`FLUSH_BYTES`, so a large or streamed body is handed over as before and the real
transport's flow control (pause_writing) still reaches uvicorn in time. Closing sends what
was gathered first; aborting drops it.

It is uvicorn's own extension point (``Config(http=<protocol class>)``); WebSocket
connections upgraded from it write through the same transport.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["FLUSH_BYTES", "CoalescingProtocol", "CoalescingTransport"]

#: Gathered bytes sent at once rather than at the end of the loop's turn: beyond a few TCP
#: segments there is nothing left to save, and the real transport must see big writes while
#: they happen to pause a writer that outruns its peer.
FLUSH_BYTES = 64 * 1024


class CoalescingTransport(asyncio.Transport):
    """A transport that sends the writes of one loop turn as one write of ``transport``.

    Args:
        transport: the connection's real transport.
        loop: the loop it runs on.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0

    # --- writing ---------------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= FLUSH_BYTES:
            self.flush()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Send what was gathered (one write of the real transport)."""
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending = []
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    # --- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._size = 0
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    # --- the rest, as the real transport --------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class CoalescingProtocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol over a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))
