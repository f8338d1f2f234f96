"""The coalescing transport: the writes of one loop turn leave as one write; closing sends
what was gathered first, aborting drops it; big writes are not held back."""

from __future__ import annotations

import asyncio
from typing import Any

from tidewire.server.http.coalesce import FLUSH_BYTES, CoalescingTransport


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self.events.append("write")

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 5


def test_writes_of_one_turn_leave_together() -> None:
    async def main() -> None:
        real = FakeTransport()
        t = CoalescingTransport(real, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 201 Created\r\n\r\n")
        t.write(b"")
        t.write(memoryview(b'{"offset":0}'))
        assert real.writes == []
        assert t.get_write_buffer_size() == 5 + 24 + 12
        await asyncio.sleep(0)
        assert real.writes == [b'HTTP/1.1 201 Created\r\n\r\n{"offset":0}']
        t.write(b"next")
        await asyncio.sleep(0)
        assert real.writes[1:] == [b"next"]

    asyncio.run(main())


def test_close_sends_first_and_abort_drops() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        real = FakeTransport()
        t = CoalescingTransport(real, loop)
        t.write(b"last words")
        t.close()
        assert real.events == ["write", "close"]
        assert real.writes == [b"last words"]
        await asyncio.sleep(0)  # the scheduled flush finds nothing more
        assert real.writes == [b"last words"]

        real = FakeTransport()
        t = CoalescingTransport(real, loop)
        t.write(b"never sent")
        t.abort()
        await asyncio.sleep(0)
        assert real.events == ["abort"]

    asyncio.run(main())


def test_big_writes_are_not_held_back() -> None:
    async def main() -> None:
        real = FakeTransport()
        t = CoalescingTransport(real, asyncio.get_running_loop())
        t.write(b"h")
        t.write(b"x" * FLUSH_BYTES)
        assert real.writes == [b"h" + b"x" * FLUSH_BYTES]  # at once: flow control sees it

    asyncio.run(main())
