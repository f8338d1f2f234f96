"""Taking messages once: a queue view of a one-partition topic through a consumer group.

:meth:`Popper.pop` reads the record at the group's committed offset (the log start when none
is committed), commits the offset after it (fsynced) and only then returns it, so a message is
handed out once, even across restarts, and a failed commit hands nothing out. Pops of one
topic are served one at a time, in the order they arrived; a pop may wait (long-poll) for the
next append. If the answer then never reaches the client the message is gone for it: taking
is at most once on the network, exactly once in the log. In a cluster the group's offsets
are kept by its coordinator, here or on another node (:class:`~.._ws_group.GroupLink`); the
msgbus mode takes pops only on the leader of the topic's partition, so one node serializes
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from tidewire.broker import Broker
from tidewire.server.http._cursor import Record, decode_records
from tidewire.server.http._params import wait_for_data_or
from tidewire.server.http._ws_group import GroupLink

__all__ = ["Popper"]

#: Bytes read from the log per step of a pop: a few records of the usual size, and at least
#: one whole batch whatever its size.
_READ_BYTES = 64 * 1024


@dataclass(slots=True)
class _Queue:
    lock: asyncio.Lock
    users: int = 0


#: The takes in progress per broker and group (see :meth:`Popper.exclusive`); an entry goes
#: with its last user, and a broker's with the broker.
_TAKES: weakref.WeakKeyDictionary[Broker, dict[str, dict[str, _Queue]]] = (
    weakref.WeakKeyDictionary()
)


def _shared_queues(broker: Broker, group: str) -> dict[str, _Queue]:
    return _TAKES.setdefault(broker, {}).setdefault(group, {})


class Popper:
    """Once-only takes from one-partition topics, for one consumer group.

    Args:
        broker: the running broker.
        group: the consumer group whose committed offsets mark what was taken.
        closing: set when the gateway drains: waiting pops give up.
    """

    def __init__(self, broker: Broker, group: str, closing: asyncio.Event) -> None:
        self.broker = broker
        self.group = group
        self.closing = closing
        # Shared by every Popper of this broker and group (the msgbus app's, and the TAKE
        # API's that serves pops forwarded by other nodes): one take of a topic at a time.
        self._queues = _shared_queues(broker, group)
        #: Called with the topic after each commit (a taker made room).
        self.on_taken: Callable[[str], None] | None = None

    async def position(self, topic: str, link: GroupLink | None = None) -> int:
        """The next offset to take (the committed offset, at least the log start)."""
        link = link or GroupLink(self.broker, self.group)
        c = (await link.committed([(topic, 0)])).get((topic, 0))
        start = self.broker.list_offset(topic, 0, -2)
        return start if c is None else max(c, start)

    async def commit(self, topic: str, offset: int, link: GroupLink | None = None) -> None:
        """Mark everything before ``offset`` taken (durably)."""
        link = link or GroupLink(self.broker, self.group)
        await link.commit({(topic, 0): offset}, member_id="", generation=-1)
        if self.on_taken is not None:
            self.on_taken(topic)

    @contextlib.asynccontextmanager
    async def exclusive(self, topic: str) -> AsyncIterator[None]:
        """Hold the lock that serializes the takes of ``topic`` (held only to read and commit,
        never while waiting for data; a writer that moves the committed offset itself, e.g.
        to drop the oldest messages, holds it too)."""
        q = self._queues.get(topic)
        if q is None:
            q = self._queues[topic] = _Queue(asyncio.Lock())
        q.users += 1
        try:
            async with q.lock:
                yield
        finally:
            q.users -= 1
            if not q.users:
                del self._queues[topic]

    async def pop(
        self,
        topic: str,
        wait_s: float = 0.0,
        accept: Callable[[Record], bool] = lambda _: True,
    ) -> Record | None:
        """Take the next record of ``topic`` that ``accept`` lets through (the others are
        passed over as taken); ``None`` if none comes within ``wait_s``.

        Raises:
            UnknownTopicError: no such topic.
            StorageError, BackpressureError: the commit failed; nothing was taken.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            async with self.exclusive(topic):
                # The group's coordinator: here, or in a cluster perhaps another node.
                link = GroupLink(self.broker, self.group)
                try:
                    rec = await self._take(topic, accept, link)
                finally:
                    await link.close()
            if rec is not None:
                return rec
            left = deadline - loop.time()
            if left <= 0 or self.closing.is_set():
                return None
            await wait_for_data_or(self.broker, [(topic, 0)], left, self.closing)

    async def _take(
        self, topic: str, accept: Callable[[Record], bool], link: GroupLink
    ) -> Record | None:
        while True:
            pos = await self.position(topic, link)
            r = self.broker.read_partition(topic, 0, pos, _READ_BYTES)
            if not r.data:
                return None
            records = decode_records(topic, 0, r.data, pos)
            for rec in records:
                if accept(rec):
                    await self.commit(topic, rec.offset + 1, link)
                    return rec
            await self.commit(topic, r.next_offset, link)  # nothing acceptable: passed over
