"""Queue messages as the clients hand them out, and what settles them.

- :class:`QueueMessage`: one message taken from a queue (a delivery to a consumer, or a get),
  with ``await msg.ack()``, ``await msg.nack(requeue=True)``, ``await msg.reject()``;
  :class:`BlockingQueueMessage` is its blocking twin (the same without ``await``).
- :class:`Settler`: settles the messages of one connection; the settlements asked for in one
  loop turn go out together, one QUEUE_SETTLE per queue and outcome.
- :func:`decode_delivery`: the messages of a delivery's data section. The data holds whole
  record batches as stored in the queue; only records whose offset has an entry belong to
  the delivery, the others are skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidewire.errors import InvalidRecordError, TidewireError, UnknownDeliveryTagError, for_code
from tidewire.protocol.frames import data_window
from tidewire.protocol.messages import (
    OUTCOME_ACK,
    OUTCOME_DEAD_LETTER,
    OUTCOME_REQUEUE,
    DeliveryEntryInfo,
    QueueSettleRequest,
)
from tidewire.records import iter_batches, iter_records

from ._transport import Transport

__all__ = [
    "BlockingQueueMessage",
    "QueueMessage",
    "Settler",
    "decode_delivery",
]

#: Tags one QUEUE_SETTLE carries at most: a bound on a request's size (about 9 bytes a tag).
MAX_SETTLE_TAGS = 10_000


@dataclass(slots=True, eq=False)
class QueueMessage:
    """One message taken from a queue.

    Attributes:
        queue: the queue it came from.
        offset: its id: its offset in the queue's log.
        delivery_tag: what settles it (unique in its queue while the broker runs).
        delivery_count: how many times it was delivered, this time included (1: first).
        routing_key: the routing key it was published with.
        value: its body.
        headers: its headers, as published (plus ``x-death`` once dead-lettered).
        timestamp_ms: when it was published (ms since the epoch).
    """

    queue: str
    offset: int
    delivery_tag: int
    delivery_count: int
    routing_key: str
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp_ms: int
    _settler: Settler | None = field(default=None, repr=False)
    _epoch: int = field(default=0, repr=False)
    #: The outcome it was settled with ("" while not settled).
    settled: str = field(default="", repr=False)

    @property
    def redelivered(self) -> bool:
        """Whether it was delivered before (``delivery_count > 1``)."""
        return self.delivery_count > 1

    def header(self, name: str) -> bytes | None:
        """The value of the header ``name`` (the last one of that name), or None."""
        for k, v in reversed(self.headers):
            if k == name:
                return v
        return None

    async def ack(self) -> None:
        """Done with it: it leaves the queue.

        Raises:
            UnknownDeliveryTagError: it is no longer held here (settled already, taken back
                after its visibility timeout, or its connection was lost: then it is
                delivered again).
        """
        await self._settle(OUTCOME_ACK)

    async def nack(self, *, requeue: bool = True) -> None:
        """Give it back: delivered again (``requeue``), or dead-lettered (dropped when its
        queue has no dead-letter exchange). Raises as :meth:`ack`."""
        await self._settle(OUTCOME_REQUEUE if requeue else OUTCOME_DEAD_LETTER)

    async def reject(self) -> None:
        """Refuse it: dead-lettered (= ``nack(requeue=False)``). Raises as :meth:`ack`."""
        await self._settle(OUTCOME_DEAD_LETTER)

    async def _settle(self, outcome: str) -> None:
        if self._settler is None:
            raise UnknownDeliveryTagError(
                f"message at offset {self.offset} of {self.queue!r} was browsed, not taken: "
                "there is nothing to settle"
            )
        if self.settled:
            raise UnknownDeliveryTagError(
                f"delivery tag {self.delivery_tag} of {self.queue!r} was settled already "
                f"({self.settled})"
            )
        await self._settler.settle([self], outcome)


@dataclass(slots=True, eq=False)
class BlockingQueueMessage:
    """The blocking twin of :class:`QueueMessage`: the same attributes, and ``ack()``,
    ``nack(requeue=True)``, ``reject()`` without ``await``."""

    queue: str
    offset: int
    delivery_tag: int
    delivery_count: int
    routing_key: str
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp_ms: int
    #: The asyncio twin's message.
    message: QueueMessage = field(repr=False)
    _run: Callable[[Coroutine[Any, Any, None]], None] = field(repr=False)

    @classmethod
    def of(
        cls, msg: QueueMessage, run: Callable[[Coroutine[Any, Any, None]], None]
    ) -> BlockingQueueMessage:
        """The twin of ``msg``, settling through ``run`` (the blocking client's loop)."""
        return cls(
            msg.queue,
            msg.offset,
            msg.delivery_tag,
            msg.delivery_count,
            msg.routing_key,
            msg.value,
            msg.headers,
            msg.timestamp_ms,
            msg,
            run,
        )

    @property
    def redelivered(self) -> bool:
        """Whether it was delivered before (``delivery_count > 1``)."""
        return self.delivery_count > 1

    @property
    def settled(self) -> str:
        """The outcome it was settled with ("" while not settled)."""
        return self.message.settled

    def header(self, name: str) -> bytes | None:
        """See :meth:`QueueMessage.header`."""
        return self.message.header(name)

    def ack(self) -> None:
        """See :meth:`QueueMessage.ack`."""
        self._run(self.message.ack())

    def nack(self, *, requeue: bool = True) -> None:
        """See :meth:`QueueMessage.nack`."""
        self._run(self.message.nack(requeue=requeue))

    def reject(self) -> None:
        """See :meth:`QueueMessage.reject`."""
        self._run(self.message.reject())


def decode_delivery(
    queue: str,
    entries: Sequence[DeliveryEntryInfo],
    data: bytes | memoryview,
    settler: Settler | None,
) -> list[QueueMessage]:
    """The messages of a delivery, in the entries' order: the records of ``data`` (whole
    batches) whose offset has an entry; every other record is skipped.

    Raises:
        RecordBatchError: a batch that fails its checks.
        InvalidRecordError: an entry's offset is in none of the batches.
    """
    if not entries:
        return []
    wanted = {e.offset: e for e in entries}
    lo, hi = min(wanted), max(wanted)
    epoch = settler.epoch if settler is not None else 0
    buf, start = data_window(data)
    end = start + len(data)
    found: dict[int, QueueMessage] = {}
    for pos, h in iter_batches(buf, verify=False, start=start, end=end):
        if h.base_offset + h.last_offset_delta < lo or h.base_offset > hi:
            continue
        with memoryview(buf) as view:
            batch = view[pos : pos + h.size]
            for r in iter_records(batch):
                e = wanted.get(r.offset)
                if e is None:
                    continue  # in the batch, not in this delivery
                found[r.offset] = QueueMessage(
                    queue=queue,
                    offset=r.offset,
                    delivery_tag=e.tag,
                    delivery_count=e.delivery_count,
                    routing_key=r.key.decode("utf-8", "replace") if r.key is not None else "",
                    value=r.value if r.value is not None else b"",
                    headers=[(k, v if v is not None else b"") for k, v in r.headers],
                    timestamp_ms=r.timestamp,
                    _settler=settler,
                    _epoch=epoch,
                )
    missing = [o for o in wanted if o not in found]
    if missing:
        raise InvalidRecordError(
            f"delivery of {queue!r}: offsets {missing[:10]} are in none of its "
            f"{len(data):,} bytes of batches"
        )
    return [found[e.offset] for e in entries]


@dataclass(slots=True)
class _Pending:
    messages: list[QueueMessage] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class Settler:
    """Settles the messages taken over one transport. Settlements asked for in the same
    loop turn are sent together: one QUEUE_SETTLE per queue and outcome.

    ``epoch`` counts the transport's connections: messages taken over an earlier connection
    cannot be settled any more (the broker took them back when it closed, and delivers them
    again), and are refused here without a request.
    """

    def __init__(self, transport: Transport) -> None:
        self._t = transport
        self.epoch = 0
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0  # QUEUE_SETTLE requests sent (for tests and statistics)

    def connection_lost(self) -> None:
        """The transport's connection broke: what it held is the broker's again."""
        self.epoch += 1

    async def settle(self, messages: Sequence[QueueMessage], outcome: str) -> None:
        """Settle ``messages`` with ``outcome`` (ack, requeue, dead-letter).

        Raises:
            UnknownDeliveryTagError: one of them was taken over a connection since lost, or
                the broker does not know one of the tags (the others are settled).
            ConnectionLostError, RequestTimedOutError: the request failed.
        """
        stale = [m for m in messages if m._epoch != self.epoch]
        if stale:
            m = stale[0]
            raise UnknownDeliveryTagError(
                f"delivery tag {m.delivery_tag} of {m.queue!r} was taken over a connection "
                "that was lost since: the broker delivers it again"
            )
        loop = asyncio.get_running_loop()
        mine: dict[tuple[str, str], asyncio.Future[None]] = {}
        for m in messages:
            key = (m.queue, outcome)
            pending = self._pending.setdefault(key, _Pending())
            pending.messages.append(m)
            if key not in mine:
                mine[key] = loop.create_future()
                pending.waiters.append(mine[key])
            m.settled = outcome
        if not mine:
            return
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        if len(mine) == 1:
            (fut,) = mine.values()
            await fut
        else:
            await asyncio.gather(*mine.values())

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for (queue, outcome), p in pending.items():
            task = asyncio.get_running_loop().create_task(
                self._send(queue, outcome, p), name="tidewire queue settle"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, queue: str, outcome: str, p: _Pending) -> None:
        tags = list(dict.fromkeys(m.delivery_tag for m in p.messages))
        error: TidewireError | None = None
        try:
            for i in range(0, len(tags), MAX_SETTLE_TAGS):
                self.requests += 1
                req = QueueSettleRequest(
                    queue=queue, tags=tags[i : i + MAX_SETTLE_TAGS], outcome=outcome
                )
                response = await self._t.request(req)
                assert response is not None
                if response.body.error_code and error is None:
                    error = for_code(response.body.error_code)(response.body.error_message)
        except TidewireError as exc:
            error = exc
        except BaseException:
            for fut in p.waiters:
                fut.cancel()
            raise
        if error is not None and not isinstance(error, UnknownDeliveryTagError):
            for m in p.messages:
                if m.settled == outcome:
                    m.settled = ""  # not settled: it may be tried again
        for fut in p.waiters:
            if fut.done():
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    async def close(self) -> None:
        """Wait for the settlements under way."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))
