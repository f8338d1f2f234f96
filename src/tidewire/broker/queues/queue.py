"""One queue's messages and deliveries: which are ready, which are held by whom, which wait
for their time, and what to do when a delivery is settled, times out or its holder goes.

A message is identified by its offset in the queue's :class:`~.store.MessageLog`. Every
unsettled message is in exactly one of these states:

- **ready**: in the requeued heap (taken back after a delivery, or due after a delay;
  delivered first, lowest offset first) or fresh (at or above ``next_fresh``, in order);
- **held**: delivered, not yet settled (:class:`Held`, by a consumer or by a ``get``'s owner);
- **delayed**: not due yet (``deliver_at`` in the future).

Settled messages (acked, dead-lettered, expired, dropped) are in ``settled`` until the floor
(the lowest unsettled offset) passes them. Changes that must survive a crash go to the
state log (:class:`~.store.StateLog`) before the request that made them is answered.

Time comes from ``clock`` (ms since the epoch); timers (visibility timeouts, delays) are
applied by :meth:`Queue.tick`, which the manager calls when one is due (tests call it after
moving a fake clock).
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tidewire.broker.queues.model import (
    Delivery,
    DeliveryEntry,
    QueueCounters,
    QueueSpec,
    QueueStatus,
)
from tidewire.broker.queues.store import (
    COUNTS,
    PROPS,
    SETTLED,
    SNAPSHOT,
    MessageLog,
    StateLog,
    Stored,
)
from tidewire.errors import QueueFullError, TidewireError
from tidewire.records import BatchHeader, iter_batches

__all__ = ["MAX_DELIVERY_BYTES", "MAX_DELIVERY_MESSAGES", "Consumer", "Held", "Queue"]

log = logging.getLogger("tidewire.broker.queues")

#: Messages handed to one consumer in one delivery at most: a larger prefetch is filled by
#: several deliveries, so that one consumer's window does not delay the others'.
MAX_DELIVERY_MESSAGES = 256
#: Bytes of one delivery at most (estimated from the batches' sizes; one message always goes).
MAX_DELIVERY_BYTES = 1024 * 1024
#: The low bits of a delivery tag: a sequence number, so a tag names one delivery of a message
#: (the offset is ``tag >> TAG_BITS``).
TAG_BITS = 16
_TAG_MASK = (1 << TAG_BITS) - 1

DeathReason = Literal["rejected", "expired", "maxlen", "delivery_limit"]
#: What the manager does with messages leaving a queue as dead letters: dead-letter (or
#: drop) them, then call :meth:`Queue.settle_dead` with them; done once the awaitable it
#: returns is.
DeadLetterHook = Callable[["Queue", list[tuple[int, int]], DeathReason], Awaitable[None]]


@dataclass(slots=True, eq=False)
class Consumer:
    """A push consumer: it holds at most ``prefetch`` messages at once."""

    tag: str
    owner: str
    prefetch: int
    deliver: Callable[[Delivery], None]
    held: int = 0
    #: Called when the consumer ends without having asked (its queue was deleted).
    cancelled: Callable[[], None] | None = None


@dataclass(slots=True)
class Held:
    """A delivery not yet settled: which message, under which tag, by whom, its count, and
    when it is taken back (0: when its holder goes)."""

    offset: int
    tag: int
    owner: str
    consumer: Consumer | None
    count: int
    deadline_ms: int
    seq: int  # deliveries of the queue in order: "ack up to" follows it


@dataclass(slots=True)
class _Range:
    """Per-publish properties of the messages ``base..last``."""

    base: int
    last: int
    expires_at_ms: int
    deliver_at_ms: int


@dataclass(slots=True)
class _Getter:
    owner: str
    wanted: int
    visibility_ms: int
    future: object  # asyncio.Future[Delivery]
    entries: list[DeliveryEntry] = field(default_factory=list)


class Queue:
    """One queue's state (see the module docstring). Runs on the broker's event loop.

    Args:
        spec: its settings.
        messages: where its messages are.
        state: its state log (durable queues), or None.
        clock: ms since the epoch.
        dead_letter: called with ``(offset, count)`` pairs leaving as dead letters.
        wake: called when deliveries may be possible (the manager schedules a dispatch).
        owner: the connection an exclusive queue belongs to.
        timer_added: called when a timer due sooner than every other is set.
    """

    def __init__(
        self,
        spec: QueueSpec,
        messages: MessageLog,
        state: StateLog | None,
        *,
        clock: Callable[[], int],
        dead_letter: DeadLetterHook,
        wake: Callable[[Queue], None],
        owner: str = "",
        timer_added: Callable[[], None] = lambda: None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.messages = messages
        self.state = state
        self.clock = clock
        self.owner = owner
        self._dead_letter = dead_letter
        self._wake = wake
        self._timer_added = timer_added
        self.counters = QueueCounters()
        self.consumers: list[Consumer] = []
        self.had_consumers = False
        self.floor = messages.start
        self.next_fresh = messages.end
        self.settled: set[int] = set()
        self.requeued: list[int] = []  # heap
        self.held: dict[int, Held] = {}
        self.counts: dict[int, int] = {}  # deliveries so far of messages not held
        self.delayed: set[int] = set()
        self._ranges: list[_Range] = []  # per-publish TTL and delay, by base
        self._range_bases: list[int] = []
        self._batches: list[Stored] = []  # by base, only batches with unsettled messages
        self._batch_bases: list[int] = []
        self._bytes = 0.0
        self._timers: list[tuple[int, int, int, int]] = []  # (due, seq, kind, value)
        self._timer_seq = itertools.count()
        self._seq = itertools.count(1)
        self._rr = 0
        self._getters: list[_Getter] = []
        self.dying: set[int] = set()  # leaving as dead letters: neither ready nor held
        self._publishing: list[int] = []  # first offsets of publishes not yet confirmed

    # --- counts ---------------------------------------------------------------------------------

    @property
    def end(self) -> int:
        return self.messages.end

    def unsettled(self) -> int:
        return (self.end - self.floor) - len(self.settled)

    @property
    def visible_end(self) -> int:
        """Offsets below this may be delivered: a publish's messages are not until it is
        confirmed (stored durably, its TTL and delay recorded)."""
        return self._publishing[0] if self._publishing else self.messages.end

    def ready_count(self) -> int:
        """Messages deliverable now."""
        return (
            self.unsettled()
            - len(self.held)
            - len(self.delayed)
            - len(self.dying)
            - (self.messages.end - self.visible_end)
        )

    def status(self) -> QueueStatus:
        """The queue as described."""
        return QueueStatus(
            spec=self.spec,
            ready=max(self.ready_count(), 0),  # a delayed publish under way counts twice
            unacked=len(self.held),
            delayed=len(self.delayed),
            bytes=max(int(self._bytes), 0),
            consumers=len(self.consumers),
            counters=self.counters,
        )

    def next_due(self) -> int | None:
        """When :meth:`tick` has something to do next (ms since the epoch), or None."""
        return self._timers[0][0] if self._timers else None

    # --- recovery -------------------------------------------------------------------------------

    def recover(self) -> None:
        """Rebuild the state from the message log's batches and the state log."""
        for s in self.messages.stored():
            self._batches.append(s)
            self._batch_bases.append(s.base)
        floor = self.messages.start
        settled: set[int] = set()
        counts: dict[int, int] = {}
        ranges: dict[int, _Range] = {}
        if self.state is not None:
            for e in self.state.entries():
                kind = e[0]
                if kind == SETTLED:
                    settled.update(e[1])
                elif kind == COUNTS:
                    for o, c in e[1]:
                        counts[o] = c
                elif kind == PROPS:
                    b, la, exp, due = e[1:5]
                    ranges[b] = _Range(b, la, exp, due)
                elif kind == SNAPSHOT:
                    floor = max(floor, e[1])
                    settled = set(e[2])
                    counts = dict(e[3])
                    ranges = {r[0]: _Range(*r) for r in e[4]}
        floor = max(floor, self.messages.start)
        self.floor = floor
        self.settled = {o for o in settled if floor <= o < self.end}
        self._advance_floor()
        self.counts = {o: c for o, c in counts.items() if o >= self.floor}
        for r in sorted(ranges.values(), key=lambda r: r.base):
            if r.last >= self.floor:
                self._ranges.append(r)
                self._range_bases.append(r.base)
        self.next_fresh = self.floor
        now = self.clock()
        for r in self._ranges:
            if r.deliver_at_ms > now:
                for o in range(max(r.base, self.floor), r.last + 1):
                    if o not in self.settled:
                        self.delayed.add(o)
                self._push_timer(r.deliver_at_ms, _DUE, r.base)
        self._trim()
        self._bytes = 0.0
        for s in self._batches:
            n = s.last - s.base + 1
            live = sum(
                1 for o in range(max(s.base, self.floor), s.last + 1) if o not in self.settled
            )
            self._bytes += s.size * live / n

    # --- publishing -----------------------------------------------------------------------------

    def check_room(self, messages: int, nbytes: int) -> None:
        """Refuse a publish that would pass a length limit under ``reject-publish``.

        Raises:
            QueueFullError: naming the limit.
        """
        spec = self.spec
        if spec.overflow != "reject-publish":
            return
        waiting = self.unsettled() - len(self.held) - len(self.dying)  # publishes under way too
        if spec.max_length and waiting + messages > spec.max_length:
            self.counters.rejected_publishes += 1
            raise QueueFullError(
                f"queue {self.name!r} holds {waiting:,} messages (max_length="
                f"{spec.max_length:,}); a publish of {messages:,} is refused"
            )
        if spec.max_length_bytes and self._bytes + nbytes > spec.max_length_bytes:
            self.counters.rejected_publishes += 1
            raise QueueFullError(
                f"queue {self.name!r} holds {int(self._bytes):,} bytes (max_length_bytes="
                f"{spec.max_length_bytes:,}); a publish of {nbytes:,} bytes is refused"
            )

    async def publish(
        self,
        batches: Sequence[tuple[memoryview, BatchHeader]],
        *,
        ttl_ms: int = 0,
        deliver_at_ms: int = 0,
    ) -> list[Stored]:
        """Store checked batches; return once durable (and their TTL and delay recorded).
        They are delivered only from then on."""
        first = self.messages.end  # the append reserves its offsets before its first wait
        self._publishing.append(first)
        # Shielded: a publisher that goes away (its request cancelled with its connection)
        # does not stop half-way a publish whose append is under way; its TTL and delay are
        # recorded before its messages can be delivered, whatever happens to the caller.
        inner = asyncio.ensure_future(self._publish(first, batches, ttl_ms, deliver_at_ms))
        inner.add_done_callback(_seen)
        stored = await asyncio.shield(inner)
        self._overflow()
        return stored

    async def _publish(
        self,
        first: int,
        batches: Sequence[tuple[memoryview, BatchHeader]],
        ttl_ms: int,
        deliver_at_ms: int,
    ) -> list[Stored]:
        try:
            return await self._store(batches, ttl_ms, deliver_at_ms)
        finally:
            self._publishing.remove(first)
            self._wake(self)

    async def _store(
        self, batches: Sequence[tuple[memoryview, BatchHeader]], ttl_ms: int, deliver_at_ms: int
    ) -> list[Stored]:
        stored = await self.messages.append(batches)
        now = self.clock()
        base, last = stored[0].base, stored[-1].last
        expires = now + ttl_ms if ttl_ms > 0 else 0
        due = deliver_at_ms if deliver_at_ms > now else 0
        if expires or due:
            r = _Range(base, last, expires, due)
            i = bisect.bisect_right(self._range_bases, base)
            self._ranges.insert(i, r)
            self._range_bases.insert(i, base)
            if due:
                self.delayed.update(range(base, last + 1))
                self._push_timer(due, _DUE, base)
            if self.state is not None:
                await self.state.write([PROPS, base, last, expires, due])
        for s in stored:
            i = bisect.bisect_right(self._batch_bases, s.base)
            self._batches.insert(i, s)
            self._batch_bases.insert(i, s.base)
            self._bytes += s.size
        n = last - base + 1
        self.counters.published += n
        return stored

    def _overflow(self) -> None:
        """Under ``drop-head``, dead-letter the oldest ready messages past a length limit."""
        spec = self.spec
        if spec.overflow != "drop-head" or not (spec.max_length or spec.max_length_bytes):
            return
        out: list[tuple[int, int]] = []
        now = self.clock()
        while (spec.max_length and self.ready_count() + len(self.delayed) > spec.max_length) or (
            spec.max_length_bytes and self._bytes > spec.max_length_bytes
        ):
            o = self._take(now, expire=False)
            if o is None:
                break
            out.append((o, self.counts.pop(o, 0)))
            self.dying.add(o)
            self._bytes -= self._size_of(o)
        if out:
            self._dead_letter(self, out, "maxlen")

    # --- delivering -----------------------------------------------------------------------------

    def _take(self, now: int, *, expire: bool = True) -> int | None:
        """The next ready message (taken out of the ready set), expiring dead ones on the way."""
        settled, held, dying = self.settled, self.held, self.dying
        expired: list[tuple[int, int]] = []
        found = None
        while self.requeued:
            o = heapq.heappop(self.requeued)
            if o in settled or o in held or o in dying or o < self.floor:
                continue
            if expire and self._expired(o, now):
                expired.append((o, self.counts.pop(o, 0)))
                continue
            found = o
            break
        if found is None:
            end = self.visible_end
            delayed = self.delayed
            while self.next_fresh < end:
                o = self.next_fresh
                self.next_fresh += 1
                if o in settled or o in delayed or o in dying:
                    continue
                if expire and self._expired(o, now):
                    expired.append((o, self.counts.pop(o, 0)))
                    continue
                found = o
                break
        if expired:
            self._expire(expired)
        return found

    def _expired(self, o: int, now: int) -> bool:
        if self._ranges:
            r = self._range_of(o)
            if r is not None and r.expires_at_ms and r.expires_at_ms <= now:
                return True
        ttl = self.spec.message_ttl_ms
        if ttl:
            b = self._batch_of(o)
            if b is not None and b.timestamp_ms + ttl <= now:
                return True
        return False

    def _expire(self, out: list[tuple[int, int]]) -> None:
        self.counters.expired += len(out)
        for o, _ in out:
            self.dying.add(o)
            self._bytes -= self._size_of(o)
        self._dead_letter(self, out, "expired")

    def dispatch(self) -> None:
        """Hand ready messages to waiting gets, then to consumers with room, round robin."""
        now = self.clock()
        while self._getters and self.ready_count() > 0:
            g = self._getters[0]
            if g.future.done():  # type: ignore[attr-defined]
                self._getters.pop(0)  # gave up
                continue
            offsets = self._take_many(g.wanted - len(g.entries), now)
            if not offsets:
                break
            d = self._hold(offsets, g.owner, None, now, g.visibility_ms)
            g.entries.extend(d.entries)
            self._getters.pop(0)
            g.future.set_result(d)  # type: ignore[attr-defined]
        consumers = self.consumers
        while consumers and self.ready_count() > 0:
            progress = False
            n = len(consumers)
            for i in range(n):
                c = consumers[(self._rr + i) % n]
                room = c.prefetch - c.held
                if room <= 0:
                    continue
                offsets = self._take_many(min(room, MAX_DELIVERY_MESSAGES), now)
                if not offsets:
                    break
                c.deliver(self._hold(offsets, c.owner, c, now, self.spec.visibility_timeout_ms))
                progress = True
            self._rr = (self._rr + 1) % max(len(consumers), 1)
            if not progress:
                break

    def _take_many(self, n: int, now: int) -> list[int]:
        """Up to ``n`` ready messages (within :data:`MAX_DELIVERY_BYTES`), taken."""
        if not self.requeued and not self._ranges and not self.spec.message_ttl_ms:
            return self._take_fresh(n)
        out: list[int] = []
        budget = MAX_DELIVERY_BYTES
        while len(out) < n:
            o = self._take(now)
            if o is None:
                break
            out.append(o)
            budget -= int(self._size_of(o))
            if budget <= 0:
                break
        return out

    def _take_fresh(self, n: int) -> list[int]:
        """:meth:`_take_many` when only fresh messages are ready and none can expire: a
        walk over offsets with no lookups but the sets of exceptions."""
        o = self.next_fresh
        end = self.visible_end
        b = self._batch_of(o)
        per = b.size / (b.last - b.base + 1) if b is not None else 1
        n = min(n, max(int(MAX_DELIVERY_BYTES // max(per, 1)), 1))
        settled, delayed, dying = self.settled, self.delayed, self.dying
        out: list[int] = []
        if not settled and not delayed and not dying:
            stop = min(end, o + n)
            out = list(range(o, stop))
            self.next_fresh = stop
            return out
        while o < end and len(out) < n:
            if o not in settled and o not in delayed and o not in dying:
                out.append(o)
            o += 1
        self.next_fresh = o
        return out

    def _hold(
        self, offsets: list[int], owner: str, consumer: Consumer | None, now: int, vt: int
    ) -> Delivery:
        """Mark ``offsets`` held and build their delivery (data read from the log). If the
        read fails, nothing is held: they are ready again (first), and the error goes up."""
        offsets.sort()
        try:
            data = self._read(offsets)
        except TidewireError:
            for o in offsets:
                heapq.heappush(self.requeued, o)
            raise
        entries = []
        deadline = now + vt if vt > 0 else 0
        seq_full = next(self._seq)
        seq = seq_full & _TAG_MASK
        counts = self.counts
        held = self.held
        redelivered = 0
        for o in offsets:
            count = counts.pop(o, 0) + 1 if counts else 1
            tag = (o << TAG_BITS) | seq
            held[o] = Held(o, tag, owner, consumer, count, deadline, seq_full)
            entries.append(DeliveryEntry(tag, o, count))
            if count > 1:
                redelivered += 1
            if deadline:
                self._push_timer(deadline, _VISIBILITY, tag)
        if consumer is not None:
            consumer.held += len(offsets)
        self.counters.delivered += len(offsets)
        self.counters.redelivered += redelivered
        return Delivery(self.name, consumer.tag if consumer else "", tuple(entries), data)

    def _read(self, offsets: Sequence[int]) -> bytes:
        """Whole batches covering ``offsets`` (ascending), each batch once."""
        parts: list[bytes] = []
        covered = -1
        for o in offsets:
            if o <= covered:
                continue
            data = self.messages.read(o, MAX_DELIVERY_BYTES)
            if not data:
                break
            for _, h in iter_batches(data, verify=False):
                covered = h.last_offset
            parts.append(data)
        return b"".join(parts)

    def add_getter(self, getter: _Getter) -> None:
        self._getters.append(getter)

    def remove_getter(self, getter: _Getter) -> None:
        if getter in self._getters:
            self._getters.remove(getter)

    def new_getter(self, owner: str, wanted: int, visibility_ms: int, future: object) -> _Getter:
        return _Getter(owner, wanted, visibility_ms, future)

    def get_now(self, owner: str, wanted: int, visibility_ms: int) -> Delivery:
        """Take up to ``wanted`` ready messages at once for ``owner``."""
        now = self.clock()
        offsets = self._take_many(wanted, now)
        if not offsets:
            return Delivery(self.name, "", (), b"")
        return self._hold(offsets, owner, None, now, visibility_ms)

    # --- settling -------------------------------------------------------------------------------

    def find_held(
        self, tags: Iterable[int], owner: str, up_to: int
    ) -> tuple[list[Held], list[int]]:
        """The deliveries ``owner`` holds among ``tags`` (and, with ``up_to``, every one it
        was handed up to and including that tag's, in delivery order, as AMQP's ack
        ``multiple``), and the tags it does not hold."""
        found: list[Held] = []
        unknown: list[int] = []
        held = self.held
        seen: set[int] = set()
        for tag in tags:
            h = held.get(tag >> TAG_BITS)
            if h is None or h.tag != tag or h.owner != owner:
                unknown.append(tag)
            elif h.offset not in seen:
                seen.add(h.offset)
                found.append(h)
        if up_to > 0:
            top = held.get(up_to >> TAG_BITS)
            if top is None or top.tag != up_to or top.owner != owner:
                unknown.append(up_to)
            else:
                for h in list(held.values()):
                    if h.seq <= top.seq and h.owner == owner and h.offset not in seen:
                        seen.add(h.offset)
                        found.append(h)
        return found, unknown

    def _release(self, hs: Iterable[Held]) -> list[Held]:
        """Take ``hs`` out of the held set; those still held (a list computed before an
        await may name one settled or taken back since): the ones to act on."""
        out = []
        held = self.held
        for h in hs:
            if held.get(h.offset) is h:
                del held[h.offset]
                if h.consumer is not None:
                    h.consumer.held -= 1
                out.append(h)
        return out

    async def ack(self, hs: list[Held]) -> None:
        """Settle ``hs`` as acknowledged; return once recorded durably."""
        hs = self._release(hs)
        offsets = [h.offset for h in hs]
        self.counters.acked += len(offsets)
        await self._settle(offsets)
        self._wake(self)

    async def requeue(self, hs: list[Held], *, durable: bool = True) -> None:
        """Take ``hs`` back: ready again (first), or dead letters past ``max_deliveries``."""
        hs = self._release(hs)
        limit = self.spec.max_deliveries
        back: list[tuple[int, int]] = []
        dead: list[tuple[int, int]] = []
        for h in hs:
            (dead if limit and h.count >= limit else back).append((h.offset, h.count))
        for o, c in back:
            self.counts[o] = c
            heapq.heappush(self.requeued, o)
        if dead:
            for o, _ in dead:
                self.dying.add(o)
                self._bytes -= self._size_of(o)
            self._dead_letter(self, dead, "delivery_limit")
        if self.state is not None and back:
            await self.state.write([COUNTS, [[o, c] for o, c in back]], durable=durable)
        self._wake(self)

    def reject(self, hs: list[Held]) -> Awaitable[None]:
        """Settle ``hs`` as dead letters (reject, or nack without requeue); the awaitable
        is done once they are dead-lettered and settled (durably, in a durable queue)."""
        hs = self._release(hs)
        for h in hs:
            self.dying.add(h.offset)
            self._bytes -= self._size_of(h.offset)
        done = self._dead_letter(self, [(h.offset, h.count) for h in hs], "rejected")
        self._wake(self)
        return done

    async def settle_dead(self, offsets: list[int], *, dead_lettered: bool) -> None:
        """Messages that left as dead letters (or were dropped) are settled."""
        for o in offsets:
            self.dying.discard(o)
        if dead_lettered:
            self.counters.dead_lettered += len(offsets)
        else:
            self.counters.dropped += len(offsets)
        await self._settle(offsets, bytes_counted=True)

    async def _settle(self, offsets: list[int], *, bytes_counted: bool = False) -> None:
        settled = self.settled
        floor = self.floor
        gone = 0.0
        b: Stored | None = None
        per = 0.0
        for o in offsets:
            if o >= floor and o not in settled:
                settled.add(o)
                if not bytes_counted:
                    if b is None or not b.base <= o <= b.last:
                        b = self._batch_of(o)
                        per = b.size / (b.last - b.base + 1) if b is not None else 0.0
                    gone += per
        self._bytes -= gone
        self._advance_floor()
        if self.state is not None and offsets:
            await self.state.write([SETTLED, offsets])

    def _advance_floor(self) -> None:
        settled = self.settled
        f = self.floor
        end = self.end
        while f < end and f in settled:
            settled.discard(f)
            f += 1
        if f != self.floor:
            self.floor = f
            self.next_fresh = max(self.next_fresh, f)
            self._trim()

    def _trim(self) -> None:
        """Forget batches and publish properties wholly below the floor."""
        f = self.floor
        i = 0
        while i < len(self._batches) and self._batches[i].last < f:
            i += 1
        if i:
            del self._batches[:i]
            del self._batch_bases[:i]
        i = 0
        while i < len(self._ranges) and self._ranges[i].last < f:
            i += 1
        if i:
            del self._ranges[:i]
            del self._range_bases[:i]

    async def purge(self) -> int:
        """Settle every ready message (not the held, delayed or dying ones); how many."""
        now = self.clock()
        out: list[int] = []
        while True:
            o = self._take(now, expire=False)
            if o is None:
                break
            out.append(o)
            self.counts.pop(o, None)
        self.counters.dropped += len(out)
        await self._settle(out)
        return len(out)

    # --- holders going --------------------------------------------------------------------------

    def add_consumer(self, c: Consumer) -> None:
        self.consumers.append(c)
        self.had_consumers = True
        self._wake(self)

    async def remove_consumer(self, c: Consumer) -> None:
        """Cancel ``c``: what it holds is taken back."""
        if c in self.consumers:
            self.consumers.remove(c)
        await self.requeue([h for h in self.held.values() if h.consumer is c], durable=False)

    def release_owner_gets(self, owner: str, tags: set[int] | None = None) -> list[Held]:
        """The deliveries of gets by ``owner`` (all, or those of ``tags``)."""
        return [
            h
            for h in self.held.values()
            if h.consumer is None and h.owner == owner and (tags is None or h.tag in tags)
        ]

    # --- time -----------------------------------------------------------------------------------

    def _push_timer(self, due: int, kind: int, value: int) -> None:
        timers = self._timers
        if not timers or due < timers[0][0]:
            self._timer_added()  # sooner than the loop planned to look
        heapq.heappush(timers, (due, next(self._timer_seq), kind, value))

    def has_expiring(self) -> bool:
        """Whether messages published with a TTL of their own may be waiting."""
        return any(r.expires_at_ms for r in self._ranges)

    async def tick(self) -> None:
        """Apply every timer due by now: delays ending, visibility timeouts, expiry at the
        head of the queue."""
        now = self.clock()
        timed_out: list[Held] = []
        became_due = False
        while self._timers and self._timers[0][0] <= now:
            _, _, kind, value = heapq.heappop(self._timers)
            if kind == _DUE:
                r = self._range_of(value)
                if r is None:
                    continue
                for o in range(r.base, r.last + 1):
                    if o in self.delayed:
                        self.delayed.discard(o)
                        became_due = True
                        if o < self.next_fresh:
                            heapq.heappush(self.requeued, o)
            else:
                h = self.held.get(value >> TAG_BITS)
                if h is not None and h.tag == value:
                    timed_out.append(h)
        if self.spec.message_ttl_ms or self._ranges:
            self._expire_head(now)
        if timed_out:
            await self.requeue(timed_out, durable=False)
        elif became_due:
            self._wake(self)

    def _expire_head(self, now: int) -> None:
        """Expire ready messages at the head of the queue whose time has passed (as RabbitMQ,
        a message behind one that lives longer expires when it reaches the head, and is never
        delivered after its time in any case)."""
        while True:
            o = self._peek()
            if o is None or not self._expired(o, now):
                return
            live = self._take(now)  # expires it (and any expired behind it up to a live one)
            if live is not None:  # taken past the expired ones: ready again, first
                heapq.heappush(self.requeued, live)
                return

    def _peek(self) -> int | None:
        while self.requeued:
            o = self.requeued[0]
            if o in self.settled or o in self.held or o in self.dying or o < self.floor:
                heapq.heappop(self.requeued)
                continue
            return o
        o = self.next_fresh
        end = self.visible_end
        while o < end and (o in self.settled or o in self.delayed):
            o += 1
        return o if o < end else None

    # --- browsing -------------------------------------------------------------------------------

    def ready_offsets(self, from_offset: int, limit: int) -> list[int]:
        """Ready messages at or above ``from_offset`` in offset order (not taken)."""
        out: list[int] = []
        o = max(from_offset, self.floor)
        held, settled, delayed, dying = self.held, self.settled, self.delayed, self.dying
        end = self.visible_end
        while o < end and len(out) < limit:
            if o not in settled and o not in held and o not in delayed and o not in dying:
                out.append(o)
            o += 1
        return out

    def browse(self, from_offset: int, limit: int) -> Delivery:
        """Ready messages from ``from_offset``, not delivered (entries' tag 0)."""
        offsets = self.ready_offsets(from_offset, limit)
        entries = tuple(DeliveryEntry(0, o, self.counts.get(o, 0)) for o in offsets)
        return Delivery(self.name, "", entries, self._read(offsets))

    async def take_for_replay(self, offsets: list[int]) -> list[int]:
        """Mark ready ``offsets`` as leaving (for a replay); the ones that were ready."""
        ready = set(self.ready_offsets(min(offsets), self.end)) if offsets else set()
        out = [o for o in offsets if o in ready]
        for o in out:
            self.dying.add(o)
        return out

    def unmove(self, offsets: list[int]) -> None:
        """Offsets taken for a replay that did not move: ready again (first)."""
        for o in offsets:
            if o in self.dying:
                self.dying.discard(o)
                if o < self.next_fresh:  # else the fresh walk still reaches it
                    heapq.heappush(self.requeued, o)
        self._wake(self)

    def undie(self, pairs: list[tuple[int, int]]) -> None:
        """Messages that were leaving as dead letters (``(offset, delivery count)``) stay:
        ready again (first), their counts kept, to leave again when next due (their
        dead-letter exchange's queues could not be reached now)."""
        for o, c in pairs:
            if o in self.dying:
                self.counts[o] = c
                self._bytes += self._size_of(o)
        self.unmove([o for o, _ in pairs])

    async def settle_moved(self, offsets: list[int]) -> None:
        for o in offsets:
            self.dying.discard(o)
        self.counters.acked += len(offsets)
        await self._settle(offsets)

    # --- upkeep ---------------------------------------------------------------------------------

    def snapshot(self) -> list[object]:
        """The whole state as a SNAPSHOT entry (held messages count as not yet delivered)."""
        counts = dict(self.counts)
        for h in self.held.values():
            if h.count > 1:
                counts[h.offset] = h.count - 1
        return [
            SNAPSHOT,
            self.floor,
            sorted(self.settled),
            [[o, c] for o, c in counts.items()],
            [[r.base, r.last, r.expires_at_ms, r.deliver_at_ms] for r in self._ranges],
        ]

    async def upkeep(self) -> None:
        """Give back settled segments of the message log; compact the state log."""
        if self.state is None:
            self.messages.delete_before(self.floor)
            return
        floor = self.floor
        await self.state.wait_durable()  # the settles below floor are on disk: safe to delete
        self.messages.delete_before(floor)
        if self.state.needs_compaction():
            await self.state.compact(self.snapshot())

    # --- lookups --------------------------------------------------------------------------------

    def _batch_of(self, o: int) -> Stored | None:
        i = bisect.bisect_right(self._batch_bases, o) - 1
        if i < 0:
            return None
        b = self._batches[i]
        return b if o <= b.last else None

    def _size_of(self, o: int) -> float:
        b = self._batch_of(o)
        return b.size / (b.last - b.base + 1) if b is not None else 0.0

    def _range_of(self, o: int) -> _Range | None:
        i = bisect.bisect_right(self._range_bases, o) - 1
        if i < 0:
            return None
        r = self._ranges[i]
        return r if o <= r.last else None


_DUE, _VISIBILITY = 0, 1


def _seen(task: asyncio.Future[list[Stored]]) -> None:
    """Retrieve a shielded publish's outcome, so that one whose caller went away does not
    warn "exception was never retrieved" (its caller got the error, or was gone)."""
    if not task.cancelled():
        task.exception()
