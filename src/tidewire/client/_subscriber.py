"""Push delivery: :class:`AsyncSubscriber` and its blocking twin :class:`Subscriber`.

A subscriber subscribes once (SUBSCRIBE) to partitions from their positions; the broker then
sends record batches as they are appended, while the subscriber has credit. The subscriber
grants credit back (CREDIT) as the application takes records (in quarters of the window, or
all of it when the broker asks: a batch larger than the credit left waits for it), so it
never holds more than ``credit_bytes`` of batches per connection (plus one batch larger than
that, sent alone) and the broker never sends more. A lost connection is reopened (with
backoff) and the subscription made again from the offset after the last record handed out:
delivery is driven by the broker's log, so nothing is lost or skipped across a reconnect
(duplicates: none either, as records below the position are dropped here).

**In a cluster** each partition is delivered by its leader only (a node refuses the others
with :class:`~tidewire.errors.NotLeaderError`): the subscriber learns the leaders from the
metadata (through the same :class:`~tidewire.client._routing.Router` as the consumer, from
the first NotLeaderError, so a single node costs nothing more) and holds one subscription per
leader node, on one connection per node, each with its own ``credit_bytes`` window. When a
partition's leader changes (the node pushes NotLeaderError for it), its node's connection is
lost, or the metadata names another leader (checked every :data:`LEADER_CHECK_S` while
nothing arrives from a node, which is how a leader cut off without closing its connections is
left), that partition alone is subscribed again on its new leader from the offset after the
last record handed out. Records are handed out once each: a batch buffered from the old
leader and delivered again by the new one is dropped below the position, as after a
reconnect. Delivery stays at-least-once only where the application's processing is (records
handed out are not handed out again by this subscriber).

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
    resolve_positions_routed,
)
from tidewire.errors import (
    ConnectionLostError,
    NotLeaderError,
    TidewireError,
    fetch_error,
    for_code,
)
from tidewire.observability import tracing as _tracing
from tidewire.observability.tracing import tracer as _tracer
from tidewire.protocol import PushReceived, ResponseReceived
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

from ._routing import LOSS, Router, RoutingStats, backoff_s, leader_lost
from ._settings import check_ints
from ._transport import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    Addresses,
    Transport,
    consumer_connect,
    parse_addrs,
)

__all__ = ["AsyncSubscriber", "Subscriber"]

#: The default window: bytes of batches the broker may send before the subscriber gives
#: any back. Large enough for a batch of a producer's default size many times over.
DEFAULT_CREDIT_BYTES = 1024 * 1024
#: In a cluster, how long a subscription may go without a push before the subscriber asks the
#: metadata whether its partitions still have the same leaders (s): a leader cut off from
#: the network keeps its connections open, silent, and another node takes its partitions
#: within its session timeout; one METADATA request per idle period is cheap.
LEADER_CHECK_S = 5.0
#: How long closing a subscription (UNSUBSCRIBE) on a node may take (s): a node that is
#: gone is not waited for, the broker ends the subscription with the connection anyway.
UNSUBSCRIBE_TIMEOUT_S = 1.0


@dataclass(slots=True, eq=False)
class _Link:
    """One subscription on one connection (a single node's, or one leader node's): the
    partitions it delivers, and the credit it is owed."""

    transport: Transport
    parts: dict[TP, None]  # in the order subscribed; a dict for the per-push lookup
    sid: int = -1  # -1: not subscribed (yet, or any more)
    lost: bool = False  # its connection broke, or a credit grant failed
    buffered: int = 0  # bytes of its frames held
    to_grant: int = 0  # bytes handed out and not yet given back
    credit_task: asyncio.Task[None] | None = None
    #: The correlation id of a grant sent by ``Transport.request_soon`` and not answered
    #: (-1: none); one grant at a time either way.
    credit_corr: int = -1
    last_push: float = 0.0  # the loop's time of its last push (or subscription)
    #: The server asks for credit when a batch waits for it (``asks_for_credit``), so
    #: small grants may be held back; else credit goes back at once when nothing is held.
    lazy: bool = False
    asked: bool = False  # a push with ``credit_wanted`` came, and not all was given back


@dataclass(slots=True)
class _Frame:
    """One push frame's records, handed out in order; its bytes are given back as credit
    to its subscription once all of them are (if that subscription still lives)."""

    tp: TP
    records: deque[ConsumerRecord]
    next_offset: int
    size: int
    link: _Link
    sid: int


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
    own (in a cluster: one per node that leads some of them).

    Use as ``async with AsyncSubscriber(addr) as sub``, then ``await sub.subscribe([("events",
    0, "earliest")])`` and ``async for record in sub`` (or ``await sub.poll(timeout_s)``).

    Args:
        addr: ``"HOST:PORT"`` of the broker, or of several nodes of a cluster
            (``"H1:P1,H2:P2"`` or a list): the first that answers is used, and in a cluster
            each partition is subscribed on its leader.
        credit_bytes: the window: the most bytes of batches the broker (in a cluster: each
            leader node) sends before this subscriber gives them back (a single larger
            batch is sent alone). >= 1.
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

        opened = consumer_connect(request_timeout_ms, connect_timeout_ms, tls, credentials)

        def connect(address: Addresses) -> Transport:
            t = opened(address)
            t.on_push = self._on_push
            t.on_lost = lambda error: self._on_lost(t)
            return t

        self._t = connect(addr)
        #: Each partition's leader in a cluster (its subscription goes there).
        self._router = Router(self._t, connect)
        self._ids = itertools.count()
        #: The live subscriptions: one per connection.
        self._links: list[_Link] = []
        #: The link of each live subscription id (pushes of any other id are dropped).
        self._by_sid: dict[int, _Link] = {}
        #: Subscribed partitions that no subscription delivers now (a leader lost, or a
        #: subscription refused for a retriable reason): subscribed again by ``poll``.
        self._unplaced: set[TP] = set()
        #: The offset of the next record handed out, per subscribed partition.
        self._positions: dict[TP, int] = {}
        self._dropped_base: dict[TP, int] = {}  # drops counted by earlier subscriptions
        self._frames: deque[_Frame] = deque()
        self._buffered = 0  # bytes of the frames held
        self._arrived = asyncio.Event()
        self._errors: list[TidewireError] = []
        self._lost = False  # a link was lost, or a partition left its link
        self._attempts = 0  # repairs in a row that did not place everything
        #: A node answered NotLeaderError: the next repair asks the metadata first.
        self._ask_metadata = False
        self._backoff = 0.0
        self._check: asyncio.Task[None] | None = None  # a leader check (cluster, idle)
        self._checked = 0.0  # the loop's time of the last leader check
        self._closed = False
        self.stats = SubscriberStats()

    async def __aenter__(self) -> AsyncSubscriber:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """End the subscriptions and close the connections."""
        if self._closed:
            return
        self._closed = True
        check, self._check = self._check, None
        if check is not None:
            await cancel_and_wait(check, ignore=(TidewireError,))
        links, self._links = self._links, []
        self._by_sid.clear()
        for link in links:
            await self._end(link)
        await self._router.close()
        await self._t.close()

    # --- subscribing --------------------------------------------------------------------------

    async def subscribe(self, positions: Iterable[tuple[str, int, Offset]]) -> None:
        """Receive exactly these partitions, each from its position; replaces what was
        subscribed before (records buffered are dropped). No partitions: unsubscribe.

        In a cluster a partition whose leader is not known yet (an election under way) is
        subscribed by :meth:`poll` once it is.

        Args:
            positions: ``(topic, partition, offset)``: an int, ``"earliest"``, ``"latest"``
                or a ``datetime``.

        Raises:
            UnknownTopicError, UnknownPartitionError, OffsetOutOfRangeError: a partition the
                broker cannot deliver (nothing is subscribed then).
            ValueError, TypeError: a position that is none of the above.
        """
        wanted = [(t, p, o) for t, p, o in positions]
        if wanted and not self._router.clustered and len(self._t.addresses) > 1:
            # A bootstrap list: a cluster's, most likely. Its leaders are asked for now, not
            # learned from a NotLeaderError later: a subscription on a node that leads all it
            # asked for would otherwise never know to watch for a leader cut off. (One
            # address: as on a single node, nothing more is asked.)
            with contextlib.suppress(*LOSS):
                await self._router.refresh({t for t, _, _ in wanted})
        resolved = await self._resolve(wanted)
        links, self._links = self._links, []
        self._by_sid.clear()
        for link in links:
            await self._end(link)
        self._frames.clear()
        self._buffered = 0
        self._errors.clear()
        self._unplaced.clear()
        self._lost = False
        self._attempts = 0
        self._positions = dict(resolved)
        self._dropped_base = dict.fromkeys(self._positions, 0)
        self.stats.dropped_by_partition = dict.fromkeys(self._positions, 0)
        try:
            await self._place(list(self._positions))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._t.request_timeout_s
            while self._unplaced and loop.time() < deadline:
                await self._repair()  # a cluster's leaders: learned from NotLeaderError
        except BaseException:
            self._positions.clear()
            links, self._links = self._links, []
            self._by_sid.clear()
            for link in links:
                await self._end(link)
            raise

    async def _resolve(self, wanted: list[tuple[str, int, Offset]]) -> list[tuple[TP, int]]:
        """Resolve positions (:func:`resolve_positions_routed`)."""
        return await resolve_positions_routed(self._router, self._t, wanted)

    async def _place(self, tps: list[TP]) -> None:
        """Subscribe ``tps`` where they are delivered: on the one connection, or in a
        cluster on each one's leader. A node that already delivers others of this subscriber
        has its subscription made again with them all (SUBSCRIBE names its partitions once).
        Partitions refused for a retriable reason are left in ``_unplaced``.

        Raises:
            TidewireError: a partition refused for good (UnknownTopicError, ...).
        """
        router = self._router
        groups: dict[int, tuple[Transport, list[TP]]] = {}
        for tp in tps:
            t = router.transport_for(*tp) if router.clustered else self._t
            groups.setdefault(id(t), (t, []))[1].append(tp)
        self._unplaced.difference_update(tps)
        fatal: TidewireError | None = None
        for t, new in groups.values():
            wanted = new
            old = next((k for k in self._links if k.transport is t and not k.lost), None)
            if old is not None:
                self._retire(old)
                await self._end(old)
                wanted = [*old.parts, *(tp for tp in new if tp not in old.parts)]
            try:
                await self._subscribe_on(t, wanted)
            except TidewireError as exc:  # the other nodes' partitions are still subscribed
                fatal = fatal or exc
        if fatal is not None:
            raise fatal

    async def _subscribe_on(self, t: Transport, parts: list[TP]) -> None:
        """One subscription on ``t`` for ``parts`` from their positions. Partitions refused
        for a retriable reason (a node that does not lead them, a lost connection) go to
        ``_unplaced``; the rest is subscribed without them.

        Raises:
            TidewireError: a partition refused for good (after the others are subscribed:
                it is not delivered any more), or the request refused as a whole.
        """
        clustered = self._router.clustered
        fatal: TidewireError | None = None
        while parts:
            sid = next(self._ids) & 0x7FFFFFFF
            link = _Link(t, dict.fromkeys(parts), sid, last_push=asyncio.get_running_loop().time())
            # Pushes of this id may arrive before the answer is read: accept them from now on.
            self._by_sid[sid] = link
            self._links.append(link)
            for tp in parts:
                self._dropped_base[tp] = self.stats.dropped_by_partition.get(tp, 0)
            req = SubscribeRequest(
                subscription_id=sid,
                partitions=[SubscribePartition(*tp, self._positions[tp]) for tp in parts],
                credit_bytes=self.credit_bytes,
                best_effort=self.best_effort,
                max_lag_bytes=self.max_lag_bytes,
            )
            try:
                response = await t.request(req)
            except TidewireError as exc:
                self._retire(link)
                if not (exc.retriable or leader_lost(exc, clustered)):
                    raise
                self._later(parts, exc)
                break
            assert response is not None
            body = response.body
            if not body.error_code:
                link.lazy = body.asks_for_credit
                break
            self._retire(link)
            moved: list[TP] = []
            bad: list[TP] = []
            for r in body.results:
                if r.error_code:
                    error = for_code(r.error_code)(r.error_message)
                    if leader_lost(error, clustered):
                        moved.append((r.topic, r.partition))
                        self._later(moved[-1:], error)
                    else:
                        bad.append((r.topic, r.partition))
                        fatal = fatal or error
            if not moved and not bad:  # refused as a whole
                error = for_code(body.error_code)(body.error_message)
                if not (error.retriable or leader_lost(error, clustered)):
                    raise error
                self._later(parts, error)
                break
            parts = [tp for tp in parts if tp not in moved and tp not in bad]
        if fatal is not None:
            raise fatal

    def _later(self, parts: list[TP], error: TidewireError) -> None:
        """``parts`` are subscribed again by the next repair; a NotLeaderError from a node
        not known to be clustered makes that repair ask the metadata (it is a cluster)."""
        self._unplaced.update(parts)
        self._lost = True
        if isinstance(error, NotLeaderError):
            self._ask_metadata = True

    def _retire(self, link: _Link) -> None:
        """Stop taking ``link``'s pushes and credit (its frames held are still handed out)."""
        self._by_sid.pop(link.sid, None)
        if link in self._links:
            self._links.remove(link)

    async def _end(self, link: _Link) -> None:
        """End ``link``'s subscription on its node (not waiting long for one gone)."""
        task, link.credit_task = link.credit_task, None
        if task is not None:
            await cancel_and_wait(task, ignore=(TidewireError,))
        corr, link.credit_corr = link.credit_corr, -1
        if corr >= 0:
            link.transport.forget_soon(corr)
        sid, link.sid = link.sid, -1
        if sid >= 0 and link.transport.connected and not link.lost:
            with contextlib.suppress(TidewireError):
                await link.transport.request(
                    UnsubscribeRequest(subscription_id=sid), timeout_s=UNSUBSCRIBE_TIMEOUT_S
                )

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
        return self._router.throttle_time_ms_total

    @property
    def routing_stats(self) -> RoutingStats:
        """What this subscriber's routing did: metadata refreshes, NotLeader retries and leader
        moves followed (a copy; see :class:`~tidewire.client.RoutingStats`)."""
        return self._router.stats_copy()

    def assignment(self) -> list[tuple[str, int]]:
        """The subscribed partitions."""
        return list(self._positions)

    # --- receiving ----------------------------------------------------------------------------

    def _on_push(self, ev: PushReceived) -> None:
        link = self._by_sid.get(ev.subscription_id)
        if link is None:
            return  # a subscription ended meanwhile
        body: PushBody = decode_body(PushBody, ev.body)
        tp = (body.topic, body.partition)
        if tp not in link.parts:
            return
        self.stats.dropped_by_partition[tp] = self._dropped_base.get(tp, 0) + body.dropped
        if body.error_code:
            error = fetch_error(
                body.error_code, body.error_message, body.damage_start, body.damage_end
            )
            if leader_lost(error, self._router.clustered):
                # Not (any more) its leader: subscribed again where the metadata says.
                del link.parts[tp]
                self._router.forget(*tp)
                self._later([tp], error)
            else:
                self._errors.append(error)
            self._arrived.set()
            return
        if body.credit_wanted:  # a batch waits until everything taken is given back
            link.asked = True
            if self._router.clustered:  # its node is alive and leads it
                link.last_push = asyncio.get_running_loop().time()
            if self._should_grant(link):
                self._grant(link)
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
        self._frames.append(_Frame(tp, deque(records), body.next_offset, size, link, link.sid))
        self._buffered += size
        link.buffered += size
        if self._router.clustered:
            link.last_push = asyncio.get_running_loop().time()
        self.stats.peak_buffered = max(self.stats.peak_buffered, self._buffered)
        self._arrived.set()

    def _on_lost(self, t: Transport) -> None:
        for link in self._links:
            if link.transport is t:
                link.lost = True
                self._lost = True
        self._arrived.set()

    def _take(self, max_records: int, ends: dict[TP, int] | None = None) -> list[ConsumerRecord]:
        """Hand out up to ``max_records`` buffered records, frame by frame; with ``ends``, set
        in it each partition's offset after the last record handed out (a frame at a time,
        so a caller that tracks positions needs no pass over the records)."""
        out: list[ConsumerRecord] = []
        frames, positions = self._frames, self._positions
        granting: list[_Link] = []
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
                if ends is not None:
                    ends[f.tp] = out[-1].offset + 1
                break
            if records:
                out += records
                positions[f.tp] = records[-1].offset + 1
                if ends is not None:
                    ends[f.tp] = records[-1].offset + 1
                records.clear()
            frames.popleft()
            if f.tp in positions:
                positions[f.tp] = max(positions[f.tp], f.next_offset)
            self._buffered -= f.size
            link = f.link
            link.buffered -= f.size
            if f.sid == link.sid and f.size:
                link.to_grant += f.size
                if not granting or granting[-1] is not link:
                    granting.append(link)
        for link in granting:
            if self._should_grant(link):
                self._grant(link)
        return out

    def _should_grant(self, link: _Link) -> bool:
        """Whether ``link.to_grant`` goes back now: in quarters of the window (few requests),
        or all of it once nothing of the link is held and its node asked for it (a batch
        larger than the credit left waits for every byte sent before) or cannot ask (an
        earlier server: then at once, so an idle subscriber never leaves a node waiting).
        A subscriber that keeps up with a modest rate so sends a grant per quarter of the
        window, not one per push (a request, its answer and a wake-up on either side)."""
        return link.to_grant > 0 and (
            link.to_grant >= self.credit_bytes // 4
            or (not link.buffered and (link.asked or not link.lazy))
        )

    def _grant(self, link: _Link) -> None:
        """Give ``link.to_grant`` bytes back to its subscription: written now and answered
        in the read callback where the connection allows (no task, no loop turn), else by
        a task."""
        if link.credit_task is not None or link.credit_corr >= 0 or link.sid < 0 or link.lost:
            return
        if not link.buffered:
            link.asked = False  # everything taken goes back with this grant
        n, link.to_grant = link.to_grant, 0
        sid, t = link.sid, link.transport
        corr = t.request_soon(
            CreditRequest(subscription_id=sid, credit_bytes=n),
            (),
            lambda got: self._credited(link, sid, n, got),
            t.request_timeout_s,
        )
        if corr is not None:
            link.credit_corr = corr
            return
        link.credit_task = asyncio.get_running_loop().create_task(
            self._send_credit(link, sid, n), name="tidewire subscriber credit"
        )

    def _credited(
        self, link: _Link, sid: int, n: int, got: ResponseReceived | TidewireError
    ) -> None:
        """The answer to a grant sent by ``request_soon`` (from the read callback): what
        :meth:`_send_credit` does once its request is answered or failed."""
        link.credit_corr = -1
        self._granted(link, sid, n, got if isinstance(got, TidewireError) else got.error)

    async def _send_credit(self, link: _Link, sid: int, n: int) -> None:
        error: TidewireError | None = None
        try:
            await link.transport.request(CreditRequest(subscription_id=sid, credit_bytes=n))
        except TidewireError as exc:
            error = exc
        finally:
            if link.credit_task is asyncio.current_task():
                link.credit_task = None
        self._granted(link, sid, n, error)

    def _granted(self, link: _Link, sid: int, n: int, error: TidewireError | None) -> None:
        """A grant of ``n`` bytes to subscription ``sid`` was answered (``error``: or
        failed): counted, or the link lost; what was handed out meanwhile goes next."""
        if error is None:
            self.stats.granted += n
        elif sid == link.sid:
            link.lost = True  # resubscribing resets the credit
            self._lost = True
            self._arrived.set()
        if not link.lost and sid == link.sid and self._should_grant(link):
            self._grant(link)

    async def poll(
        self, timeout_s: float | None = None, *, max_records: int = DEFAULT_MAX_RECORDS
    ) -> list[ConsumerRecord]:
        """Return the records available, waiting up to ``timeout_s`` (None: until some
        arrive) for the first; an empty list when none came in time.

        Raises:
            OffsetOutOfRangeError, UnknownTopicError, PartitionCorruptError, ...: the broker
                stopped delivering a partition (the others go on).
        """
        return await self._poll(timeout_s, max_records, None)

    async def _poll(
        self, timeout_s: float | None, max_records: int, ends: dict[TP, int] | None
    ) -> list[ConsumerRecord]:
        """:meth:`poll`; with ``ends``, each partition's offset after the last record handed
        out is set in it (see :meth:`_take`: what a group member's positions need)."""
        if not self._positions:
            raise ValueError("nothing is subscribed: call subscribe() first")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            out = self._take(max_records, ends)
            if out:
                return out
            if self._errors:
                raise self._errors.pop(0)
            if self._closed:
                raise ConnectionLostError("the subscriber is closed")
            if self._lost:
                await self._repair()
                continue
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return []
            self._arrived.clear()
            if self._frames or self._lost or self._errors:
                continue
            wait = remaining
            if self._router.clustered:
                self._check_leaders(loop.time())
                wait = LEADER_CHECK_S if remaining is None else min(remaining, LEADER_CHECK_S)
            # Awaited in this task (not asyncio.wait_for, which runs the wait as a task of
            # its own and wakes this one through a done callback: two loop turns more
            # between a push read and the poll that hands it out).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._arrived.wait()

    def _check_leaders(self, now: float) -> None:
        """In a cluster: when a subscription has had no push for :data:`LEADER_CHECK_S`,
        ask the metadata (in the background) whether its partitions moved; those that did
        are subscribed again on their new leader by the next ``poll`` round."""
        if (self._check is not None and not self._check.done()) or now - self._checked < (
            LEADER_CHECK_S
        ):
            return
        if not any(now - link.last_push >= LEADER_CHECK_S for link in self._links):
            return
        self._checked = now
        self._check = asyncio.get_running_loop().create_task(
            self._check_once(), name="tidewire subscriber leader check"
        )

    async def _check_once(self) -> None:
        with contextlib.suppress(TidewireError):  # no answer: the next check asks again
            await self._router.refresh({topic for topic, _ in self._positions})
        if self._moved():
            self._arrived.set()

    def _moved(self) -> bool:
        """Take partitions whose leader (as the router knows it) is not their link's node
        off their link, into ``_unplaced``; returns whether there were any."""
        router = self._router
        moved = False
        for link in list(self._links):
            if link.transport.closed:  # the router closed a node's connection: leads none
                link.lost = True
                self._lost = moved = True
                continue
            # A partition without a leader now (an election under way) stays where it is:
            # its node pushes NotLeaderError, or its connection breaks, if it is gone.
            gone = [
                tp
                for tp in link.parts
                if router.leader(*tp) >= 0 and router.transport_for(*tp) is not link.transport
            ]
            if gone:
                for tp in gone:
                    del link.parts[tp]
                self._unplaced.update(gone)
                self._lost = moved = True
        return moved

    async def _repair(self) -> None:
        """Subscribe again what is not delivered: the partitions of lost links and those a
        node said it does not lead, after a backoff (in a cluster: the routing's, and a
        metadata refresh first)."""
        self._lost = False
        clustered = self._router.clustered
        for link in [k for k in self._links if k.lost]:
            self._retire(link)
            self._unplaced.update(link.parts)
            await self._end(link)
            if clustered:
                for tp in link.parts:
                    self._router.forget(*tp)
        for link in [k for k in self._links if not k.parts]:  # every partition moved off
            self._retire(link)
            await self._end(link)
        if not self._unplaced:
            return
        self._attempts += 1
        if clustered:
            pause = backoff_s(self._attempts)
        else:
            self._backoff = min(max(self._backoff * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
            pause = self._backoff
        await asyncio.sleep(pause)
        if clustered or self._ask_metadata:
            # Where are they now? (Unclustered: a NotLeaderError said it is a cluster.)
            self._ask_metadata = False
            with contextlib.suppress(*LOSS):
                await self._router.refresh({topic for topic, _ in self._unplaced})
            if self._router.clustered:
                self._moved()
        todo = sorted(self._unplaced)
        try:
            await self._place(todo)
        except TidewireError:
            self._lost = True
            raise
        if not self._unplaced:
            self.stats.resubscribes += 1
            self._attempts = 0
            self._backoff = 0.0
        else:
            self._lost = True

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
