"""Push delivery: :class:`AsyncSubscriber` and its blocking twin :class:`Subscriber`.

A subscriber subscribes once (SUBSCRIBE) to partitions from their positions; the broker then
sends record batches as they are appended, while the subscriber has credit. The subscriber
grants credit back (CREDIT) as the application takes records, so it never holds more than
``credit_bytes`` of batches (plus one batch larger than that, sent alone) and the broker never
sends more. A lost connection is reopened (with backoff) and the subscription made again from
the offset after the last record handed out: delivery is driven by the broker's log, so
nothing is lost or skipped across a reconnect (duplicates: none either, as records below the
position are dropped here).

With ``best_effort=True`` the broker skips a partition ahead to its end when the subscriber
lags more than ``max_lag_bytes`` behind, and counts the records skipped: :meth:`dropped`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tidewire._tasks import cancel_and_wait
from tidewire.client._consumer import (
    DEFAULT_MAX_RECORDS,
    TP,
    BlockingReader,
    ConsumerRecord,
    Offset,
    _parse,
    resolve_positions,
)
from tidewire.errors import ConnectionLostError, TidewireError, fetch_error, for_code
from tidewire.observability import tracing as _tracing
from tidewire.observability.tracing import tracer as _tracer
from tidewire.protocol import PushReceived
from tidewire.protocol.frames import data_window
from tidewire.protocol.messages import (
    CreditRequest,
    PushBody,
    SubscribePartition,
    SubscribeRequest,
    UnsubscribeRequest,
    decode_body,
)
from tidewire.security.credentials import Credentials
from tidewire.security.tls import TlsOptions

from ._settings import check_ints
from ._transport import BACKOFF_MAX_S, BACKOFF_MIN_S, Addresses, Transport, parse_addrs

__all__ = ["AsyncSubscriber", "Subscriber"]

#: The default window: bytes of batches the broker may send before the subscriber gives
#: any back. Large enough for a batch of a producer's default size many times over.
DEFAULT_CREDIT_BYTES = 1024 * 1024
#: Records handed out by one ``poll`` at most, by default.


@dataclass(slots=True)
class _Frame:
    """One push frame's records, handed out in order; its bytes are given back as credit
    once all of them are."""

    tp: TP
    records: deque[ConsumerRecord]
    next_offset: int
    size: int


@dataclass(slots=True)
class SubscriberStats:
    """Bytes of push data received and credit granted, since the subscriber was made."""

    received: int = 0
    granted: int = 0
    frames: int = 0
    peak_buffered: int = 0
    resubscribes: int = 0
    dropped_by_partition: dict[TP, int] = field(default_factory=dict)


class AsyncSubscriber:
    """Receives pushed records of partitions from their positions, over a connection of its
    own.

    Use as ``async with AsyncSubscriber(addr) as sub``, then ``await sub.subscribe([("events",
    0, "earliest")])`` and ``async for record in sub`` (or ``await sub.poll(timeout_s)``).

    Args:
        addr: ``"HOST:PORT"`` of the broker, or of several nodes of a cluster
            (``"H1:P1,H2:P2"`` or a list): the first that answers is used.
        credit_bytes: the window: the most bytes of batches the broker sends before this
            subscriber gives them back (a single larger batch is sent alone). >= 1.
        best_effort: let the broker skip ahead (counting drops) rather than lag.
        max_lag_bytes: best effort: how far behind the end a partition may fall.
        request_timeout_ms: how long a request may take.
        connect_timeout_ms: how long opening the connection may take.
        tls: TLS to the broker: :class:`~tidewire.client.TlsOptions`, True (the system's
            CAs), or None (plaintext).
        credentials: the API key to authenticate every connection with
            (:class:`~tidewire.client.Credentials`), or None. A key the broker refuses raises
            :class:`~tidewire.errors.AuthenticationFailedError` (not retried).
    """

    def __init__(
        self,
        addr: Addresses = "127.0.0.1:7400",
        *,
        credit_bytes: int = DEFAULT_CREDIT_BYTES,
        best_effort: bool = False,
        max_lag_bytes: int = 64 * 1024 * 1024,
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        check_ints(
            ("credit_bytes", credit_bytes, 1),
            ("max_lag_bytes", max_lag_bytes, 0),
            ("request_timeout_ms", request_timeout_ms, 1),
            ("connect_timeout_ms", connect_timeout_ms, 1),
        )
        self.credit_bytes = credit_bytes
        self.best_effort = best_effort
        self.max_lag_bytes = max_lag_bytes
        #: The consumer group this subscriber reads for (tracing names it), if any.
        self.group_name: str | None = None
        self._addr = addr if isinstance(addr, str) else ",".join(addr)
        self._t = Transport(
            addr,
            request_timeout_s=request_timeout_ms / 1000,
            connect_timeout_s=connect_timeout_ms / 1000,
            max_in_flight=8,
            tls=tls,
            credentials=credentials,
        )
        self._t.on_push = self._on_push
        self._t.on_lost = self._on_lost
        self._ids = itertools.count()
        self._sid = -1  # the live subscription's id; -1: none
        #: The offset of the next record handed out, per subscribed partition.
        self._positions: dict[TP, int] = {}
        self._dropped_base: dict[TP, int] = {}  # drops counted by earlier subscriptions
        self._frames: deque[_Frame] = deque()
        self._buffered = 0  # bytes of the frames held
        self._to_grant = 0  # bytes handed out and not yet given back
        self._credit_task: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()
        self._errors: list[TidewireError] = []
        self._lost = False
        self._backoff = 0.0
        self._closed = False
        self.stats = SubscriberStats()

    async def __aenter__(self) -> AsyncSubscriber:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """End the subscription and close the connection."""
        if self._closed:
            return
        self._closed = True
        if self._sid >= 0 and self._t.connected:
            with contextlib.suppress(TidewireError):
                await self._t.request(UnsubscribeRequest(subscription_id=self._sid), timeout_s=1)
        task, self._credit_task = self._credit_task, None
        if task is not None:
            await cancel_and_wait(task, ignore=(TidewireError,))
        await self._t.close()

    # --- subscribing --------------------------------------------------------------------------

    async def subscribe(self, positions: Iterable[tuple[str, int, Offset]]) -> None:
        """Receive exactly these partitions, each from its position; replaces what was
        subscribed before (records buffered are dropped). No partitions: unsubscribe.

        Args:
            positions: ``(topic, partition, offset)``: an int, ``"earliest"``, ``"latest"``
                or a ``datetime``.

        Raises:
            UnknownTopicError, UnknownPartitionError, OffsetOutOfRangeError: a partition the
                broker cannot deliver (nothing is subscribed then).
            ValueError, TypeError: a position that is none of the above.
        """
        resolved = await resolve_positions(self._t, [(t, p, o) for t, p, o in positions])
        self._positions = dict(resolved)
        self._dropped_base = dict.fromkeys(self._positions, 0)
        self.stats.dropped_by_partition = dict.fromkeys(self._positions, 0)
        await self._subscribe()

    async def _subscribe(self) -> None:
        old, self._sid = self._sid, -1
        if old >= 0 and self._t.connected and not self._lost:
            await self._t.request(UnsubscribeRequest(subscription_id=old))
        self._frames.clear()
        self._buffered = self._to_grant = 0
        self._lost = False
        self._errors.clear()
        for tp, n in self.stats.dropped_by_partition.items():
            self._dropped_base[tp] = n
        if not self._positions:
            return
        sid = next(self._ids) & 0x7FFFFFFF
        # Pushes of this id may arrive before the answer is read: accept them from now on.
        self._sid = sid
        req = SubscribeRequest(
            subscription_id=sid,
            partitions=[SubscribePartition(t, p, o) for (t, p), o in self._positions.items()],
            credit_bytes=self.credit_bytes,
            best_effort=self.best_effort,
            max_lag_bytes=self.max_lag_bytes,
        )
        try:
            response = await self._t.request(req)
        except BaseException:
            self._sid = -1
            raise
        assert response is not None
        if response.body.error_code:
            self._sid = -1
            raise for_code(response.body.error_code)(response.body.error_message)

    def position(self, topic: str, partition: int) -> int:
        """The offset of the next record this subscriber hands out for the partition.

        Raises:
            ValueError: the partition is not subscribed.
        """
        try:
            return self._positions[(topic, partition)]
        except KeyError:
            raise ValueError(f"{topic!r} partition {partition} is not subscribed") from None

    def dropped(self, topic: str | None = None, partition: int | None = None) -> int:
        """Records the broker skipped in best-effort mode: for one partition, or all."""
        counts = self.stats.dropped_by_partition
        if topic is None:
            return sum(counts.values())
        return counts.get((topic, partition if partition is not None else 0), 0)

    @property
    def throttle_time_ms_total(self) -> int:
        """How long the broker held this subscriber's fetch answers back in all (ms), because
        its principal was over a quota (0: never throttled)."""
        return self._t.throttle_time_ms_total

    def assignment(self) -> list[tuple[str, int]]:
        """The subscribed partitions."""
        return list(self._positions)

    # --- receiving ----------------------------------------------------------------------------

    def _on_push(self, ev: PushReceived) -> None:
        if ev.subscription_id != self._sid or self._sid < 0:
            return  # a subscription ended meanwhile
        body: PushBody = decode_body(PushBody, ev.body)
        tp = (body.topic, body.partition)
        if tp not in self._positions:
            return
        self.stats.dropped_by_partition[tp] = self._dropped_base.get(tp, 0) + body.dropped
        if body.error_code:
            self._errors.append(
                fetch_error(body.error_code, body.error_message, body.damage_start, body.damage_end)
            )
            self._arrived.set()
            return
        size = len(ev.data)
        if size:
            buf, start = data_window(ev.data)
            records, _ = _parse(tp, body.offset, buf, start, start + size)
            t = _tracer()  # None without an OpenTelemetry SDK
            if t is not None and records:
                _tracing.record_receive(t, records, None, self._addr, self.group_name)
        else:
            records = []
        self.stats.received += size
        self.stats.frames += 1
        self._frames.append(_Frame(tp, deque(records), body.next_offset, size))
        self._buffered += size
        self.stats.peak_buffered = max(self.stats.peak_buffered, self._buffered)
        self._arrived.set()

    def _on_lost(self, error: TidewireError) -> None:
        self._lost = True
        self._arrived.set()

    def _take(self, max_records: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        frames, positions = self._frames, self._positions
        while frames and len(out) < max_records:
            f = frames[0]
            records = f.records
            floor = positions.get(f.tp, 0)
            while records and records[0].offset < floor:
                records.popleft()  # already handed out before a reconnect
            room = max_records - len(out)
            if len(records) > room:  # a frame's records are in order: hand out a prefix
                out += [records.popleft() for _ in range(room)]
                positions[f.tp] = out[-1].offset + 1
                break
            if records:
                out += records
                positions[f.tp] = records[-1].offset + 1
                records.clear()
            frames.popleft()
            positions[f.tp] = max(positions.get(f.tp, 0), f.next_offset)
            self._buffered -= f.size
            self._to_grant += f.size
        # Give credit back in quarters of the window (fewer requests), or all of it once
        # nothing is held (so an idle subscriber never leaves the broker waiting).
        if self._to_grant and (self._to_grant >= self.credit_bytes // 4 or not frames):
            self._grant()
        return out

    def _grant(self) -> None:
        if self._credit_task is not None or self._sid < 0:
            return
        n, self._to_grant = self._to_grant, 0
        self._credit_task = asyncio.get_running_loop().create_task(
            self._send_credit(self._sid, n), name="tidewire subscriber credit"
        )

    async def _send_credit(self, sid: int, n: int) -> None:
        try:
            await self._t.request(CreditRequest(subscription_id=sid, credit_bytes=n))
            self.stats.granted += n
        except TidewireError:
            self._lost = True  # resubscribing resets the credit
            self._arrived.set()
        finally:
            self._credit_task = None
        if self._to_grant and not self._lost and sid == self._sid:
            self._grant()

    async def poll(
        self, timeout_s: float | None = None, *, max_records: int = DEFAULT_MAX_RECORDS
    ) -> list[ConsumerRecord]:
        """Return the records available, waiting up to ``timeout_s`` (None: until some
        arrive) for the first; an empty list when none came in time.

        Raises:
            OffsetOutOfRangeError, UnknownTopicError, PartitionCorruptError, ...: the broker
                stopped delivering a partition (the others go on).
        """
        if not self._positions:
            raise ValueError("nothing is subscribed: call subscribe() first")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            out = self._take(max_records)
            if out:
                return out
            if self._errors:
                raise self._errors.pop(0)
            if self._closed:
                raise ConnectionLostError("the subscriber is closed")
            if self._lost:
                await self._resubscribe()
                continue
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return []
            self._arrived.clear()
            if self._frames or self._lost or self._errors:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    async def _resubscribe(self) -> None:
        """The connection broke: subscribe again from the positions, after a backoff."""
        self._backoff = min(max(self._backoff * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
        await asyncio.sleep(self._backoff)
        try:
            await self._subscribe()
        except TidewireError as exc:
            if not exc.retriable:
                raise
            self._lost = True
            return
        self.stats.resubscribes += 1
        self._backoff = 0.0

    def __aiter__(self) -> AsyncSubscriber:
        return self

    async def __anext__(self) -> ConsumerRecord:
        (r,) = await self.poll(None, max_records=1)
        return r


class Subscriber(BlockingReader[AsyncSubscriber]):
    """The blocking twin of :class:`AsyncSubscriber`: the same methods without ``await``,
    and ``for record in subscriber``."""

    _closed_error = ConnectionLostError
    _closed_message = "the subscriber is closed"

    def __init__(
        self,
        addr: Addresses = "127.0.0.1:7400",
        *,
        credit_bytes: int = DEFAULT_CREDIT_BYTES,
        best_effort: bool = False,
        max_lag_bytes: int = 64 * 1024 * 1024,
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        parse_addrs(addr)
        options: dict[str, Any] = {
            "credit_bytes": credit_bytes,
            "best_effort": best_effort,
            "max_lag_bytes": max_lag_bytes,
            "request_timeout_ms": request_timeout_ms,
            "connect_timeout_ms": connect_timeout_ms,
            "tls": tls,
            "credentials": credentials,
        }
        self._local: deque[ConsumerRecord] = deque()
        self._start_loop("tidewire-subscriber")
        try:
            self._async = self._run(self._make(addr, options))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(addr: Addresses, options: dict[str, Any]) -> AsyncSubscriber:
        return AsyncSubscriber(addr, **options)

    def subscribe(self, positions: Iterable[tuple[str, int, Offset]]) -> None:
        self._local.clear()
        self._run(self._async.subscribe(list(positions)))

    def dropped(self, topic: str | None = None, partition: int | None = None) -> int:
        return self._async.dropped(topic, partition)
