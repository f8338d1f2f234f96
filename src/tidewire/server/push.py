"""Push delivery: the subscriptions of one connection, each reading record batches from the
log and sending them as PUSH frames while the client has granted it credit (in steps that are
callbacks of the event loop: no task a subscription).

Delivery is driven by the log, never by an in-memory fan-out: a subscription keeps a position
per partition, reads whole batches from there (as a fetch would), and when it has caught up it
waits on the broker's append wake-ups (the ones long-poll fetches use). Nothing is read ahead
of what is about to be written, so the broker holds for a subscription only what sits in the
connection's write buffer, and that is bounded by the credit:

- **credit** = bytes granted (the first grant in SUBSCRIBE, then CREDIT requests) minus bytes
  sent (the data sections of the push frames). A push goes out only if its data fits in the
  credit, so the bytes sent and not yet given back never exceed the window (the first grant).
- **the oversized-batch rule**: a single batch larger than the credit is sent (alone) only
  when the credit is at least the whole window, that is when the client has given back every
  byte sent before; the credit then goes below zero and nothing more is sent until grants
  bring it above zero again. So at most ``window + one batch`` bytes are in flight. While
  such a batch waits, the client is told once (a push with no data and ``credit_wanted``;
  again after each grant that did not let it go): a client may hold small grants back (ours
  gives credit back in quarters of the window) and would otherwise never know.
- a subscription also waits while the socket's write buffer is over its high-water mark
  (``pause_writing``), like every answer on the connection.
- **best effort** (``best_effort``): when a partition's position is more than
  ``max_lag_bytes`` behind the high watermark (or below the log start, after retention),
  the position jumps to the high watermark and the records skipped are counted; the
  cumulative count per partition travels in every push frame's ``dropped`` field (a push
  with no data announces a skip at once).

A subscription ends with UNSUBSCRIBE or with its connection. A partition whose read fails
(an unknown topic, an offset out of range outside best effort, corruption) gets one push with
the error and is not delivered any more.

**In a cluster** (``broker.replication`` set) a partition is delivered by its leader only: a
SUBSCRIBE naming a partition this node does not lead (a follower, or a node that holds no
replica of it) is refused with :class:`~tidewire.errors.NotLeaderError` (retriable, naming the
leader when known), and a partition whose lead this node loses while it is delivered gets one
push with that error and is not delivered any more: the client subscribes it again on its new
leader from the next offset it has not handed out. A leader accepts a position up to its own
log end (not only its high watermark): a new leader's high watermark may still be below what
the previous one delivered, and the subscription then waits until it gets there. Topics that
are not the cluster's (internal topics every node keeps for itself) are served as on a single
node.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from tidewire.broker import Broker
from tidewire.errors import (
    BackpressureError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    PartitionCorruptError,
    TidewireError,
)
from tidewire.protocol import Connection
from tidewire.protocol.frames import Buffer
from tidewire.protocol.messages import (
    ApiKey,
    Body,
    CreditRequest,
    CreditResponse,
    PartitionResult,
    PushBody,
    SubscribeRequest,
    SubscribeResponse,
    UnsubscribeRequest,
    UnsubscribeResponse,
    encode_body,
)

__all__ = [
    "MAX_PUSH_BYTES",
    "MAX_SUBSCRIPTIONS",
    "PUSH_APIS",
    "Subscription",
    "Subscriptions",
]

log = logging.getLogger("tidewire.server")

#: The APIs the connection serves itself: they create state that lives with the connection.
PUSH_APIS = frozenset({ApiKey.SUBSCRIBE, ApiKey.CREDIT, ApiKey.UNSUBSCRIBE})
#: Subscriptions one connection may hold: each is a waiter on the broker, and the
#: broker's waiter bound (max_fetch_waiters) is shared by every connection.
MAX_SUBSCRIPTIONS = 64
#: Partitions of one subscription: the same bound as a commit's partition list.
MAX_SUBSCRIPTION_PARTITIONS = 10_000
#: The most data one push frame carries (a larger single batch goes alone): one read from the
#: log per frame, of a size that keeps a frame far below the 64 MiB frame limit.
MAX_PUSH_BYTES = 1024 * 1024
#: How long a caught-up subscription waits for an append before it reads again anyway: the
#: wake-up is what normally ends the wait; this only bounds one that was missed (a wake-up
#: released for a shutdown, a partition added).
RECHECK_S = 1.0


@dataclass(slots=True)
class _Part:
    topic: str
    partition: int
    position: int
    dropped: int = 0
    done: bool = False
    #: In a cluster: led by this node when subscribed (delivery stops once it is not).
    led: bool = False


@dataclass(slots=True)
class SubscriptionStats:
    """What a subscription sent and was granted (bytes of data sections), for tests and
    metrics. ``in_flight`` is what was sent and not given back: the most the broker can
    hold for the subscription (in the connection's write buffer)."""

    granted: int = 0
    sent: int = 0
    frames: int = 0
    peak_in_flight: int = 0
    largest_frame: int = 0
    dropped: int = 0
    asks: int = 0  # pushes with credit_wanted (a batch waited for credit)


@dataclass(slots=True)
class Subscription:
    """One subscription: its partitions and positions, its credit, and where its delivery
    stands (see :class:`Subscriptions`: it has no task of its own)."""

    subscription_id: int
    parts: list[_Part]
    window: int
    best_effort: bool
    max_lag_bytes: int
    credit: int = 0
    stats: SubscriptionStats = field(default_factory=SubscriptionStats)
    #: A push with ``credit_wanted`` was sent and no grant has come since.
    asked: bool = False
    #: What its delivery waits for while no step is queued: _READY (nothing: a step is
    #: queued, or it has not started or has ended), _CREDIT, _WRITABLE or _DATA.
    wants: int = 0
    started: bool = False
    stopped: bool = False
    #: Its next step, queued in the loop.
    step: asyncio.Handle | None = None
    #: The partitions it waits on among the broker's waiters (None: not among them).
    parked: list[tuple[str, int]] | None = None
    #: When it began to wait for data (loop time), and the timer that bounds that wait.
    parked_at: float = 0.0
    timer: asyncio.TimerHandle | None = None
    #: Where the next step starts among its partitions (each step starts one further on).
    rotate: int = 0
    #: Its stand-in among the broker's waiters.
    waker: _Waker | None = None
    #: The context its steps run in: the SUBSCRIBE request's (its log lines are that
    #: request's, whoever's wake-up queued the step).
    context: contextvars.Context | None = None

    @property
    def in_flight(self) -> int:
        """Bytes sent that the client has not given back as credit yet."""
        return self.window - self.credit

    def grant(self, n: int) -> None:
        self.credit += n
        self.stats.granted += n
        self.asked = False


class _Waker:
    """A subscription's stand-in among the partitions' waiters (:meth:`Broker.add_waiter`): a
    wake-up queues its next step."""

    __slots__ = ("_sub", "_subs")

    def __init__(self, subs: Subscriptions, sub: Subscription) -> None:
        self._subs = subs
        self._sub = sub

    def done(self) -> bool:
        return self._sub.parked is None

    def set_result(self, _: None, /) -> None:
        self._subs.woken(self._sub)


class Subscriptions:
    """The subscriptions of one connection.

    A subscription's delivery runs in steps, each a callback of the loop (no task, no future):
    a step sends what it can, then queues the next step at once (more to send), or waits for
    credit (a grant queues it), for the socket to drain (:meth:`resume` queues it) or for data
    (a wake-up of one of its partitions queues it, as it does a long-poll fetch's read; a
    timer every ``RECHECK_S`` bounds a wake-up that was missed).

    Args:
        broker: where batches are read from.
        conn: the connection's sans-IO state (push frames are encoded with it).
        write: writes buffers to the socket.
        writable: set while the socket's write buffer is below its high-water mark.
    """

    def __init__(
        self,
        broker: Broker,
        conn: Connection,
        write: Callable[[list[Buffer]], None],
        writable: asyncio.Event,
        *,
        max_subscriptions: int = MAX_SUBSCRIPTIONS,
    ) -> None:
        self.broker = broker
        self.conn = conn
        self._write = write
        self._writable = writable
        self.max_subscriptions = max_subscriptions
        self.subs: dict[int, Subscription] = {}
        self._next_id = 0
        #: The loop the steps run on (asked once, at the first start).
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle(self, api_key: int, body: Body) -> Body:
        """Serve SUBSCRIBE, CREDIT or UNSUBSCRIBE.

        Raises:
            InvalidRequestError: a bad subscription id, credit or partition list.
            BackpressureError: the connection holds ``max_subscriptions`` already.
        """
        if isinstance(body, SubscribeRequest):
            return self._subscribe(body)
        if isinstance(body, CreditRequest):
            if body.credit_bytes < 1:
                raise InvalidRequestError(f"credit_bytes={body.credit_bytes} must be >= 1")
            sub = self._get(body.subscription_id)
            sub.grant(body.credit_bytes)
            if sub.wants == _CREDIT:
                self._queue(sub)
            return CreditResponse()
        if isinstance(body, UnsubscribeRequest):
            sub = self._get(body.subscription_id)
            del self.subs[sub.subscription_id]
            self._stop(sub)
            return UnsubscribeResponse()
        raise InvalidRequestError(f"{type(body).__name__} is not a push delivery request")

    def _get(self, sid: int) -> Subscription:
        sub = self.subs.get(sid)
        if sub is None:
            raise InvalidRequestError(f"no subscription {sid} on this connection")
        return sub

    def _subscribe(self, req: SubscribeRequest) -> SubscribeResponse:
        if len(self.subs) >= self.max_subscriptions:
            raise BackpressureError(
                f"{len(self.subs)} subscriptions on this connection "
                f"(max_subscriptions={self.max_subscriptions})"
            )
        if req.credit_bytes < 1:
            raise InvalidRequestError(f"credit_bytes={req.credit_bytes} must be >= 1")
        if req.max_lag_bytes < 0:
            raise InvalidRequestError(f"max_lag_bytes={req.max_lag_bytes} must be >= 0")
        if not 1 <= len(req.partitions) <= MAX_SUBSCRIPTION_PARTITIONS:
            raise InvalidRequestError(
                f"{len(req.partitions):,} partitions: a subscription has "
                f"1..{MAX_SUBSCRIPTION_PARTITIONS:,}"
            )
        sid = req.subscription_id
        if sid == -1:
            while self._next_id in self.subs:
                self._next_id = (self._next_id + 1) & 0x7FFFFFFF
            sid = self._next_id
            self._next_id = (self._next_id + 1) & 0x7FFFFFFF
        elif not 0 <= sid <= 0x7FFFFFFF:
            raise InvalidRequestError(f"subscription_id={sid} must be -1 or 0..2,147,483,647")
        elif sid in self.subs:
            raise InvalidRequestError(f"subscription {sid} exists on this connection already")
        results: list[PartitionResult] = []
        parts: list[_Part] = []
        failed: TidewireError | None = None
        seen: set[tuple[str, int]] = set()
        for p in req.partitions:
            try:
                if (p.topic, p.partition) in seen:
                    raise InvalidRequestError(
                        f"{p.topic!r} partition {p.partition} is listed twice"
                    )
                seen.add((p.topic, p.partition))
                led = self._check_leader(p.topic, p.partition)
                plog = self.broker.log(p.topic, p.partition)
                start, end = plog.log_start_offset, self.broker.high_watermark(p.topic, p.partition)
                if led:  # up to where the previous leader may have delivered (see above)
                    end = max(end, plog.log_end_offset)
                if not (start <= p.offset <= end or (req.best_effort and p.offset >= 0)):
                    raise OffsetOutOfRangeError(
                        f"offset {p.offset} is outside {p.topic!r} partition {p.partition}'s "
                        f"range {start}..{end}"
                    )
            except TidewireError as exc:
                failed = failed or exc
                results.append(
                    PartitionResult(
                        topic=p.topic,
                        partition=p.partition,
                        error_code=exc.code,
                        error_message=exc.message,
                    )
                )
                continue
            results.append(PartitionResult(topic=p.topic, partition=p.partition))
            parts.append(_Part(p.topic, p.partition, p.offset, led=led))
        if failed is not None:
            return SubscribeResponse(
                subscription_id=sid,
                results=results,
                error_code=failed.code,
                error_message=failed.message,
            )
        sub = Subscription(sid, parts, req.credit_bytes, req.best_effort, req.max_lag_bytes)
        sub.waker = _Waker(self, sub)
        sub.grant(req.credit_bytes)
        self.subs[sid] = sub
        return SubscribeResponse(subscription_id=sid, results=results, asks_for_credit=True)

    def _check_leader(self, topic: str, partition: int) -> bool:
        """In a cluster: whether this node leads the partition (True), or has no role for it
        and holds its log (False: served as on a single node).

        Raises:
            NotLeaderError: another node leads it, or this node holds no replica of it.
        """
        rep = self.broker.replication
        if rep is None:
            return False
        if rep.leads(topic, partition):
            return True
        if rep.leader_of(topic, partition) is None:
            # No role here: a node's own internal topic (not in the cluster's metadata) is
            # served from its log; a topic of the cluster's is not (yet) led here.
            known = self.broker.cluster_topics
            if known is None or topic not in known():
                try:
                    self.broker.log(topic, partition)
                    return False
                except TidewireError:
                    pass
        rep.check_leader(topic, partition)  # raises NotLeaderError, naming what it knows
        return True  # led after all (took the lead in between)

    def start(self, sid: int) -> None:
        """Start delivering a subscription (after its SUBSCRIBE answer is written, so that
        no push frame of it reaches the client before the answer)."""
        sub = self.subs.get(sid)
        if sub is None or sub.started:
            return
        sub.started = True
        sub.context = contextvars.copy_context()
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._queue(sub)

    def resume(self) -> None:
        """The socket's write buffer went below its low-water mark: the subscriptions that
        waited for it go on."""
        for sub in self.subs.values():
            if sub.wants == _WRITABLE:
                self._queue(sub)

    def close(self) -> None:
        """Tear every subscription down (the connection is gone)."""
        for sub in self.subs.values():
            self._stop(sub)
        self.subs.clear()

    # --- delivery -----------------------------------------------------------------------------

    def _queue(self, sub: Subscription) -> None:
        """Queue the subscription's next step (once)."""
        if sub.step is None and not sub.stopped:
            assert self._loop is not None
            sub.wants = _READY
            sub.step = self._loop.call_soon(self._run, sub, context=sub.context)

    def _stop(self, sub: Subscription) -> None:
        sub.stopped = True
        sub.wants = _READY
        if sub.step is not None:
            sub.step.cancel()
            sub.step = None
        self._unpark(sub)
        if sub.timer is not None:
            sub.timer.cancel()
            sub.timer = None

    def woken(self, sub: Subscription) -> None:
        """A wake-up of one of the partitions it waits on (or the broker released its
        waiters): its next step reads them."""
        if sub.parked is not None:
            self._unpark(sub)
            self._queue(sub)

    def _unpark(self, sub: Subscription) -> None:
        keys, sub.parked = sub.parked, None
        if keys is not None:
            assert sub.waker is not None
            self.broker.drop_waiter(keys, sub.waker)

    def _recheck(self, sub: Subscription) -> None:
        """The timer of a wait for data: once it has lasted RECHECK_S, read anyway. One timer
        a subscription, moved on as it fires, not one a wait."""
        sub.timer = None
        if sub.stopped or sub.wants != _DATA:
            return  # the next wait arms it again
        assert self._loop is not None
        due = sub.parked_at + RECHECK_S
        if self._loop.time() < due:
            sub.timer = self._loop.call_at(due, self._recheck, sub, context=sub.context)
            return
        self._unpark(sub)
        self._queue(sub)

    def _run(self, sub: Subscription) -> None:
        sub.step = None
        if sub.stopped:
            return
        try:
            self._deliver(sub)
        except Exception:  # a bug: this subscription stops, the connection goes on
            log.exception("subscription %s failed", sub.subscription_id)
            self._stop(sub)

    def _deliver(self, sub: Subscription) -> None:
        """One step: a round over the partitions, then what it waits for."""
        if not self._writable.is_set():
            sub.wants = _WRITABLE
            return
        sent = more = blocked = False
        live = [p for p in sub.parts if not p.done]
        if not live:
            return  # every partition failed: nothing more to deliver
        sub.rotate = rotate = (sub.rotate + 1) % len(live)
        order = live[rotate:] + live[:rotate]
        for i, part in enumerate(order):
            outcome = self._step(sub, part)
            sent |= outcome in (_SENT, _CAUGHT_UP)
            more |= outcome == _SENT
            blocked |= outcome == _NO_CREDIT
            if sent and not self._writable.is_set():
                more |= i + 1 < len(order)  # the others are looked at next time
                break
        if more:
            self._queue(sub)  # the connection's other work runs between frames
        elif blocked:
            sub.wants = _CREDIT
        else:
            # Nothing to send now, or every push sent took its partition up to what
            # readers may see: the next step would find nothing, so wait for data at
            # once (a turn and a read fewer a push than stepping again to find out).
            assert self._loop is not None
            assert sub.waker is not None
            sub.wants = _DATA
            sub.parked_at = now = self._loop.time()
            keys = [(p.topic, p.partition) for p in live if not p.done]
            if self.broker.add_waiter(keys, sub.waker):
                sub.parked = keys
            # else: the broker's waiter bound, or it is closing: the timer polls
            if sub.timer is None:
                sub.timer = self._loop.call_at(
                    now + RECHECK_S, self._recheck, sub, context=sub.context
                )

    def _step(self, sub: Subscription, part: _Part) -> int:
        """Send at most one push for ``part``: what happened (_SENT, _NO_CREDIT, _IDLE;
        _CAUGHT_UP: sent, and the push reached the high watermark it was read at, so
        nothing more is there to read until readers may see more)."""
        if sub.credit <= 0:
            return _NO_CREDIT
        try:
            if part.led:
                rep = self.broker.replication
                if rep is not None and not rep.leads(part.topic, part.partition):
                    rep.check_leader(part.topic, part.partition)  # NotLeaderError: stop here
            if sub.best_effort and self._skip_if_behind(sub, part):
                return _SENT
            r = self.broker.read_partition(
                part.topic, part.partition, part.position, min(sub.credit, MAX_PUSH_BYTES)
            )
        except TidewireError as exc:
            part.done = True
            self._push(sub, part, offset=part.position, next_offset=part.position, hw=-1, error=exc)
            return _SENT
        size = len(r.data)
        if not size:
            return _IDLE
        if size > sub.credit and sub.credit < sub.window:
            # One batch larger than the credit: only with nothing in flight. A client may
            # hold small grants back, so it is asked (once a wait) for what it has taken.
            if not sub.asked:
                sub.asked = True
                sub.stats.asks += 1
                self._push(
                    sub,
                    part,
                    offset=part.position,
                    next_offset=part.position,
                    hw=r.high_watermark,
                    credit_wanted=True,
                )
            return _NO_CREDIT
        start, part.position = part.position, r.next_offset
        self.broker.count_delivered(part.topic, part.partition, max(r.next_offset - start, 0), size)
        sub.credit -= size
        stats = sub.stats
        stats.sent += size
        stats.frames += 1
        stats.largest_frame = max(stats.largest_frame, size)
        stats.peak_in_flight = max(stats.peak_in_flight, sub.in_flight)
        self._push(
            sub, part, offset=start, next_offset=r.next_offset, hw=r.high_watermark, data=r.data
        )
        return _CAUGHT_UP if r.next_offset >= r.high_watermark else _SENT

    def _skip_if_behind(self, sub: Subscription, part: _Part) -> bool:
        b = self.broker
        plog = b.log(part.topic, part.partition)
        hw = b.high_watermark(part.topic, part.partition)
        end = plog.log_end_offset if part.led else hw  # see the module docstring
        out_of_range = not plog.log_start_offset <= part.position <= max(hw, end)
        if not out_of_range and part.position > hw:
            return False  # a new leader's high watermark has not reached it yet: wait
        if not out_of_range and (
            part.position == hw
            or b.bytes_behind(part.topic, part.partition, part.position) <= sub.max_lag_bytes
        ):
            return False
        skipped = max(hw - part.position, 0)
        start, part.position = part.position, hw
        part.dropped += skipped
        sub.stats.dropped += skipped
        b.stats.dropped += skipped
        self._push(sub, part, offset=start, next_offset=hw, hw=hw)
        return True

    def _push(
        self,
        sub: Subscription,
        part: _Part,
        *,
        offset: int,
        next_offset: int,
        hw: int,
        data: bytes = b"",
        error: TidewireError | None = None,
        credit_wanted: bool = False,
    ) -> None:
        body = PushBody(
            topic=part.topic,
            partition=part.partition,
            offset=offset,
            next_offset=next_offset,
            high_watermark=hw,
            dropped=part.dropped,
            error_code=0 if error is None else error.code,
            error_message="" if error is None else error.message,
            credit_wanted=credit_wanted,
        )
        if isinstance(error, PartitionCorruptError):
            body.damage_start, body.damage_end = error.damage_start, error.damage_end
        self._write(
            self.conn.send_push(
                sub.subscription_id, ApiKey.SUBSCRIBE, encode_body(body), [data] if data else []
            )
        )


_SENT, _NO_CREDIT, _IDLE, _CAUGHT_UP = 1, 2, 3, 4
_READY, _CREDIT, _WRITABLE, _DATA = 0, 1, 2, 3
