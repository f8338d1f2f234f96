"""The audit log: who did what, from where, allowed or denied.

Every authentication, every administrative operation, every change of ACLs and keys and
every denial is one :class:`AuditEvent`, JSON in the value of one record of the internal
topic ``__audit`` (single partition, fsynced at an interval, kept ``retention_ms``; see
:func:`~tidewire.security._logs.audit_config`). The record's timestamp is the event's time,
so the log's time index finds where a time range starts.

Recording never blocks a request: :meth:`AuditLog.record` appends to a buffer in memory and a
background task writes what is buffered as one record batch every ``flush_interval_s`` (or
sooner, once :data:`FLUSH_EVENTS` wait). Memory is bounded: once ``max_pending`` events wait
to be written, further events are counted instead of kept, one counter per (principal,
source, action, outcome), and each counter is written as one summary event ("12,345 more
like this suppressed"), so a flood of failed logins costs a bounded amount of memory and the
log still says how many there were.

In a cluster (:meth:`AuditLog.replicate`), each node's events carry its node id and are
written to the node's own replicated topic ``__audit.<node id>`` (see
:mod:`tidewire.cluster.audit`), only while the node leads it (they wait in the buffer,
bounded as above, meanwhile); a query answers the cluster's audit log, every node's, from
any node.

Secrets never reach the log: any text that looks like an API key (``twk_<id>_<secret>``) in
any field of an event is replaced, when the event is made, by ``[key <id>]`` (the id alone
names a key without being one).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import re
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import msgspec

from tidewire._tasks import wait_event
from tidewire.errors import InvalidRequestError, TidewireError
from tidewire.records import BatchBuilder
from tidewire.security._logs import AUDIT_TOPIC, StoredRecord, audit_config, open_log, read_log
from tidewire.storage import LogConfig, LogManager, PartitionLog

__all__ = [
    "DEFAULT_RETENTION_MS",
    "INTERFACES",
    "MAX_QUERY_LIMIT",
    "OUTCOMES",
    "Actor",
    "AuditAnswer",
    "AuditEvent",
    "AuditLog",
    "AuditQuery",
    "AuditReplication",
    "current_actor",
    "redact",
]

log = logging.getLogger("tidewire.security")

#: The interfaces an event may come through.
INTERFACES = ("binary", "http", "websocket", "sse", "msgbus", "ipubsub", "kafka", "cli")
#: What became of the attempt: allowed or denied by the gate; an operation that ran and
#: succeeded (ok) or failed (failed).
OUTCOMES = ("allowed", "denied", "failed", "ok")
#: How long audit records are kept unless configured (the default of
#: ``[security] audit_retention_ms``): 30 days.
DEFAULT_RETENTION_MS = 30 * 24 * 3600 * 1000
#: Events written per record batch: one batch of this many is ~150 KB, well under any
#: log's batch limit.
FLUSH_EVENTS = 500
#: Distinct (principal, source, action, outcome) counters kept while the buffer is full;
#: beyond them every further event is counted in one catch-all counter. Bounds the memory a
#: flood of ever-new principal names or addresses can take.
MAX_SUMMARIES = 1024
#: Characters kept of one text field (a principal name, a reason, a detail value): the
#: texts may come from clients, and an event must stay small.
MAX_FIELD_CHARS = 512
#: Entries kept of an event's ``detail``.
MAX_DETAIL_ENTRIES = 16
#: Events one query returns at most.
MAX_QUERY_LIMIT = 10_000
#: The longest wait between two tries of a write that keeps failing (seconds).
MAX_RETRY_S = 10.0
#: Records a query reads between two yields to the event loop.
_YIELD_EVERY = 2000

#: An API key, or anything starting like one: ``twk_`` then, when it is a key, its 12-hex id
#: and ``_`` and the secret. Matched case-insensitively and up to a separator, so a key
#: inside any text is caught.
_KEY_LIKE = re.compile(r"twk_(?:([0-9a-f]{12})(?=_))?[^\s\"'<>,;]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every API-key-like token replaced by ``[key <id>]`` (``[redacted]``
    when it has no id), and cut to :data:`MAX_FIELD_CHARS` characters."""
    if "twk_" in text.lower():
        text = _KEY_LIKE.sub(
            lambda m: f"[key {m.group(1).lower()}]" if m.group(1) else "[redacted]", text
        )
    if len(text) > MAX_FIELD_CHARS:
        text = f"{text[: MAX_FIELD_CHARS - 24]}... ({len(text) - MAX_FIELD_CHARS + 24:,} more)"
    return text


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class AuditEvent(msgspec.Struct, kw_only=True):
    """One audited attempt. Every text field is passed through :func:`redact` when the event
    is made (or decoded), so no API key can be stored.

    Attributes:
        time_ms: when, ms since the epoch.
        principal: who (None: anonymous, or not known, as before authentication).
        source: the client's ``host:port`` ("" when not known).
        interface: one of :data:`INTERFACES`.
        action: the API or route (``CREATE_TOPIC``, ``POST /v1/topics``), or ``authenticate``,
            ``acl.add``, ``key.create``, ``key.revoke`` ...
        resource: what it acted on (``topic:orders``, ``group:g1``, ``cluster``,
            ``principal:alice``; "" for none).
        outcome: one of :data:`OUTCOMES`.
        reason: why, in a few words (``no ACL allows write on topic:orders``,
            ``wrong API key``, the error of a failed operation).
        detail: more, as text (at most :data:`MAX_DETAIL_ENTRIES` entries).
        node_id: in a cluster, the node that recorded it (None on a single node).
    """

    time_ms: int
    principal: str | None = None
    source: str = ""
    interface: str
    action: str
    resource: str = ""
    outcome: str
    reason: str = ""
    detail: dict[str, str] = msgspec.field(default_factory=dict)
    node_id: int | None = None

    def __post_init__(self) -> None:
        if self.principal is not None:
            self.principal = redact(self.principal)
        self.source = redact(self.source)
        self.interface = redact(self.interface)
        self.action = redact(self.action)
        self.resource = redact(self.resource)
        self.outcome = redact(self.outcome)
        self.reason = redact(self.reason)
        if self.detail:
            items = list(self.detail.items())[:MAX_DETAIL_ENTRIES]
            self.detail = {redact(k): redact(v) for k, v in items}


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AuditEvent)

#: (principal, source, action, outcome): what makes events "alike" for coalescing.
_Like = tuple[str | None, str, str, str]
#: The counter that takes every event once :data:`MAX_SUMMARIES` others exist.
_OTHERS: _Like = ("*", "*", "*", "*")


@dataclass(frozen=True, slots=True)
class Actor:
    """Who a request comes from, for the events its handler records: set by the server
    for each request (see :data:`current_actor`)."""

    principal: str | None = None
    source: str = ""
    interface: str = "binary"


#: An anonymous principal from an unknown address, on the binary protocol.
_NOBODY = Actor()
#: The actor of the request being handled, in its task: the server's gate sets it once it
#: knows the principal and the client's address; handlers read it when they record.
current_actor: contextvars.ContextVar[Actor] = contextvars.ContextVar(
    "tidewire_audit_actor", default=_NOBODY
)


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """The filters of an audit query (see :meth:`AuditLog.query`)."""

    since_ms: int | None = None
    until_ms: int | None = None
    principal: str | None = None
    action: str | None = None
    outcome: str | None = None

    def matches(self, e: AuditEvent) -> bool:
        """Whether ``e`` passes every filter."""
        return (
            (self.since_ms is None or e.time_ms >= self.since_ms)
            and (self.until_ms is None or e.time_ms < self.until_ms)
            and (self.principal is None or (e.principal or "") == self.principal)
            and (self.action is None or e.action == self.action)
            and (self.outcome is None or e.outcome == self.outcome)
        )


class AuditAnswer(NamedTuple):
    """A query's answer: the events, and in a cluster the nodes whose audit logs no node
    answered for in time (their events are missing: the answer is partial)."""

    events: list[AuditEvent]
    missing_nodes: tuple[int, ...] = ()


class AuditReplication(Protocol):
    """Where the audit log of a cluster node lives (:class:`tidewire.cluster.audit.ClusterAudit`
    is one): the node's own replicated log, and the other nodes' logs."""

    def writable(self) -> PartitionLog | None:
        """The log this node's events are appended to now (the local replica of its own
        audit log, which it leads); None: not now (the events stay buffered)."""
        ...

    def appended(self) -> None:
        """Events were appended to :meth:`writable`'s log (followers copy them at once)."""
        ...

    def local_logs(self, nodes: Collection[int]) -> list[PartitionLog]:
        """This node's replicas of the audit logs of ``nodes``."""
        ...

    async def query(self, query: AuditQuery, limit: int) -> AuditAnswer:
        """The newest ``limit`` events of every node's audit log that match, oldest first,
        and the nodes whose logs could not be read."""
        ...


class _Summary:
    """Events counted instead of kept while the buffer was full."""

    __slots__ = ("count", "first", "last_ms")

    def __init__(self, first: AuditEvent) -> None:
        self.first = first
        self.count = 1
        self.last_ms = first.time_ms

    def event(self, key: _Like) -> AuditEvent:
        e = self.first
        mixed = key == _OTHERS
        return AuditEvent(
            time_ms=self.last_ms,
            principal=e.principal if not mixed else None,
            source=e.source if not mixed else "",
            interface=e.interface,
            action=e.action if not mixed else "*",
            resource=e.resource if not mixed else "",
            outcome=e.outcome if not mixed else "*",
            reason=(
                f"{self.count:,} more like this suppressed (the audit buffer was full)"
                if not mixed
                else f"{self.count:,} more events suppressed (the audit buffer was full; "
                "of many principals, sources, actions and outcomes)"
            ),
            detail={
                "suppressed": str(self.count),
                "first_ms": str(e.time_ms),
                "last_ms": str(self.last_ms),
                "first_reason": e.reason,
            },
            node_id=e.node_id,
        )


class AuditLog:
    """The audit log of a broker: a buffer in memory, written by a background task to
    ``__audit``.

    Args:
        logs: the broker's log manager (open).
        retention_ms: how long records are kept (-1: forever).
        max_pending: events kept in memory waiting to be written; beyond, alike events are
            counted into summaries (see the module docstring). At least 1.
        flush_interval_s: how often the buffer is written (> 0).
        clock: ms since the epoch, for the time of events made here.

    Raises:
        InvalidRequestError: ``max_pending`` or ``flush_interval_s`` out of range.
    """

    def __init__(
        self,
        logs: LogManager,
        retention_ms: int = DEFAULT_RETENTION_MS,
        *,
        max_pending: int = 10_000,
        flush_interval_s: float = 0.1,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        if max_pending < 1:
            raise InvalidRequestError(f"max_pending={max_pending} must be >= 1")
        if not flush_interval_s > 0:
            raise InvalidRequestError(f"flush_interval_s={flush_interval_s} must be > 0")
        self._logs = logs
        self._config = audit_config(retention_ms)
        self.max_pending = max_pending
        self.flush_interval_s = flush_interval_s
        self.clock = clock
        self._plog: PartitionLog | None = None
        self._pending: list[AuditEvent] = []
        self._writing = 0  # events taken from the buffer and not yet written
        self._summaries: dict[_Like, _Summary] = {}
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._open_failed = False
        self._replication: AuditReplication | None = None
        #: In a cluster: this node's id, stamped on its events.
        self.node_id: int | None = None
        #: Events recorded, counted into summaries, and lost (recorded after close, or
        #: when the log refused them at close), since start: for metrics and tests.
        self.recorded = 0
        self.suppressed = 0
        self.lost = 0

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Open ``__audit`` (giving it this log's settings) and start the writer. Call in
        the event loop. A broker that never recorded an event has no ``__audit``: the first
        event creates it (see :meth:`record`)."""
        if (AUDIT_TOPIC, 0) in self._logs.logs:
            self._plog = open_log(self._logs, AUDIT_TOPIC, self._config)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="audit writer")
        self._task.add_done_callback(_log_failure)

    async def close(self) -> None:
        """Write what is buffered and stop the writer. Events recorded later are lost
        (counted in :attr:`lost`)."""
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        if task is not None:  # it writes what is buffered, then ends
            self._wake.set()
            await asyncio.wait([task])
        try:
            await self._write_buffered()
        except TidewireError as exc:
            self.lost += len(self._pending) + sum(s.count for s in self._summaries.values())
            log.error("audit: %s event(s) could not be written at close: %s", self.lost, exc)
            self._pending.clear()
            self._summaries.clear()

    @property
    def config(self) -> LogConfig:
        """The settings of the audit log's partition log (its retention, its fsync)."""
        return self._config

    def replicate(self, replication: AuditReplication | None, node_id: int | None = None) -> None:
        """Write this node's events to its replicated audit log in a cluster (stamped with
        ``node_id``), and answer queries with the cluster's audit log; None: the node's own
        ``__audit`` again (the node left its cluster)."""
        self._replication = replication
        self.node_id = node_id if replication is not None else None
        if replication is not None:
            self._wake.set()  # what waits is written where it belongs from now on

    # --- recording --------------------------------------------------------------------------

    def record(self, event: AuditEvent) -> None:
        """Buffer ``event`` to be written (never blocks, never raises on a full buffer:
        alike events are counted then, see the module docstring)."""
        if self._closed:
            self.lost += 1
            log.debug("audit: event after close not written: %s", event.action)
            return
        self.recorded += 1
        if self.node_id is not None and event.node_id is None:
            event.node_id = self.node_id
        if self._plog is None and not self._open_failed and self._replication is None:
            self._open()
        if len(self._pending) + self._writing < self.max_pending:
            self._pending.append(event)
            if len(self._pending) >= FLUSH_EVENTS:
                self._wake.set()
            return
        self.suppressed += 1
        key: _Like = (event.principal, event.source, event.action, event.outcome)
        summary = self._summaries.get(key)
        if summary is None and len(self._summaries) >= MAX_SUMMARIES:
            key = _OTHERS
            summary = self._summaries.get(key)
        if summary is None:
            self._summaries[key] = _Summary(event)
        else:
            summary.count += 1
            summary.last_ms = max(summary.last_ms, event.time_ms)

    def _restore(self, key: _Like, old: _Summary) -> None:
        """Count the events of an unwritten summary again (after a failed write)."""
        summary = self._summaries.get(key)
        if summary is None and len(self._summaries) >= MAX_SUMMARIES and key != _OTHERS:
            key = _OTHERS
            summary = self._summaries.get(key)
        if summary is None:
            self._summaries[key] = old
        else:
            summary.count += old.count
            summary.first = old.first
            summary.last_ms = max(summary.last_ms, old.last_ms)

    def _open(self) -> None:
        """Create the log now, in the request that recorded the first event (once: a few
        files), rather than later in the writer: so its files are open from a known point
        on. A failure is logged; the writer tries again."""
        try:
            self._plog = open_log(self._logs, AUDIT_TOPIC, self._config)
        except TidewireError as exc:
            self._open_failed = True  # not again on every event: the writer retries
            log.error(
                "audit: creating %s failed (tried again at the next write): %s", AUDIT_TOPIC, exc
            )

    def event(
        self,
        action: str,
        outcome: str,
        *,
        resource: str = "",
        reason: str = "",
        principal: str | None = None,
        source: str | None = None,
        interface: str | None = None,
        detail: dict[str, str] | None = None,
    ) -> None:
        """Record an event of the request being handled, now: its principal, source and
        interface are those of :data:`current_actor` unless given."""
        actor = current_actor.get()
        self.record(
            AuditEvent(
                time_ms=self.clock(),
                principal=principal if principal is not None else actor.principal,
                source=source if source is not None else actor.source,
                interface=interface or actor.interface,
                action=action,
                resource=resource,
                outcome=outcome,
                reason=reason,
                detail=detail or {},
            )
        )

    @property
    def pending(self) -> int:
        """Events buffered or being written, and summaries waiting."""
        return len(self._pending) + self._writing + len(self._summaries)

    # --- writing ----------------------------------------------------------------------------

    async def _run(self) -> None:
        delay = self.flush_interval_s
        while not self._closed:
            await wait_event(self._wake, delay)  # or the interval passed: write anyway
            self._wake.clear()
            try:
                await self._write_buffered()
            except TidewireError as exc:
                # Kept (still bounded) and tried again, less and less often.
                delay = min(delay * 2, MAX_RETRY_S)
                log.error(
                    "audit: writing %d event(s) failed (next try in %.1f s): %s",
                    self.pending,
                    delay,
                    exc,
                )
            else:
                delay = self.flush_interval_s

    async def flush(self) -> None:
        """Write what is buffered now (what a query should see).

        Raises:
            StorageError, LogFailedError: the log refused the write; the events stay buffered.
        """
        await self._write_buffered()

    async def _write_buffered(self) -> None:
        async with self._write_lock:
            if not self._pending and not self._summaries:
                return
            replication = self._replication
            plog = replication.writable() if replication is not None else self._plog
            if plog is None:
                if replication is not None:  # not led here now: kept (bounded) until it is
                    return
                plog = self._plog = open_log(self._logs, AUDIT_TOPIC, self._config)
            events, self._pending = self._pending, []
            summaries, self._summaries = self._summaries, {}
            written = events + [s.event(key) for key, s in summaries.items()]
            self._writing = len(events)
            try:
                batches = [
                    _batch(written[i : i + FLUSH_EVENTS])
                    for i in range(0, len(written), FLUSH_EVENTS)
                ]
                # One task per batch, queued in this turn (one write for all), so that when
                # the write fails every batch's error is collected (append_many_async
                # would leave the later ones unretrieved).
                results = await asyncio.gather(
                    *(plog.append_async(b) for b in batches), return_exceptions=True
                )
                for r in results:
                    if isinstance(r, BaseException):
                        raise r
                if replication is not None:
                    replication.appended()
            except TidewireError:
                # Put them back, in front of what came meanwhile, to be tried again (a write
                # that failed part way may store some twice: better than none); summaries
                # stay counters, so the memory stays bounded however often writes fail.
                self._pending = events + self._pending
                for key, old in summaries.items():
                    self._restore(key, old)
                raise
            finally:
                self._writing = 0

    # --- reading ----------------------------------------------------------------------------

    async def query(
        self,
        *,
        since_ms: int | None = None,
        until_ms: int | None = None,
        principal: str | None = None,
        action: str | None = None,
        outcome: str | None = None,
        limit: int = 1000,
    ) -> list[AuditEvent]:
        """The newest ``limit`` events that match, oldest first: the events of
        :meth:`answer` (in a cluster, without saying which nodes' logs were missing)."""
        got = await self.answer(
            since_ms=since_ms,
            until_ms=until_ms,
            principal=principal,
            action=action,
            outcome=outcome,
            limit=limit,
        )
        return got.events

    async def answer(
        self,
        *,
        since_ms: int | None = None,
        until_ms: int | None = None,
        principal: str | None = None,
        action: str | None = None,
        outcome: str | None = None,
        limit: int = 1000,
    ) -> AuditAnswer:
        """The newest ``limit`` events that match, oldest first, and (in a cluster) the
        nodes whose audit logs no node answered for (a partial answer). Buffered events are
        written first, so what was recorded before the call is found.

        Args:
            since_ms: only events at or after this time (ms since the epoch).
            until_ms: only events before this time.
            principal: only this principal's events (``""``: anonymous ones).
            action: only this action.
            outcome: only this outcome.
            limit: at most this many (1..:data:`MAX_QUERY_LIMIT`).

        Raises:
            InvalidRequestError: ``limit`` out of range, or ``until_ms`` before ``since_ms``.
            StorageError: the log cannot be read.
        """
        if not 1 <= limit <= MAX_QUERY_LIMIT:
            raise InvalidRequestError(f"limit={limit:,} must be within 1..{MAX_QUERY_LIMIT:,}")
        if since_ms is not None and until_ms is not None and until_ms < since_ms:
            raise InvalidRequestError(f"until={until_ms} is before since={since_ms}")
        q = AuditQuery(since_ms, until_ms, principal, action, outcome)
        try:
            await self.flush()
        except TidewireError as exc:
            log.error("audit: buffered events not written before a query: %s", exc)
        if self._replication is not None:
            return await self._replication.query(q, limit)
        plog = self._plog
        if plog is None:  # nothing was ever recorded
            return AuditAnswer([])
        return AuditAnswer(await _query_log(plog, q, limit))

    async def query_nodes(
        self, query: AuditQuery, limit: int, nodes: Collection[int]
    ) -> list[AuditEvent]:
        """In a cluster: the newest ``limit`` events that match of the audit logs of
        ``nodes`` as this node's replicas hold them (none: not replicated here), oldest
        first. What another node asks to answer a query of the cluster's audit log.

        Raises:
            InvalidRequestError: ``limit`` out of range, or this node is not in a cluster.
        """
        if not 1 <= limit <= MAX_QUERY_LIMIT:
            raise InvalidRequestError(f"limit={limit:,} must be within 1..{MAX_QUERY_LIMIT:,}")
        if self._replication is None:
            raise InvalidRequestError("this broker is not a node of a cluster")
        if self.node_id in nodes:
            try:
                await self.flush()
            except TidewireError as exc:
                log.error("audit: buffered events not written before a query: %s", exc)
        found: list[AuditEvent] = []
        for plog in self._replication.local_logs(nodes):
            found.extend(await _query_log(plog, query, limit))
        return newest(found, limit)


def newest(events: list[AuditEvent], limit: int) -> list[AuditEvent]:
    """The newest ``limit`` of ``events`` (of one or several logs), oldest first."""
    events.sort(key=lambda e: e.time_ms)  # stable: log order among equal times
    return events[-limit:]


async def _query_log(plog: PartitionLog, q: AuditQuery, limit: int) -> list[AuditEvent]:
    """The newest ``limit`` events of ``plog`` that match ``q``, oldest first."""
    start = plog.log_start_offset
    if q.since_ms is not None:
        found = plog.offset_for_timestamp(q.since_ms)
        if found is None:
            return []
        start = found
    end = plog.log_end_offset
    # Newest segments first, each read forward, until enough are found: the newest
    # events of a long log cost a read of its last segments only.
    bounds = [b for b in plog.segment_bases if b < end]
    found_events: collections.deque[AuditEvent] = collections.deque()
    seen = 0
    for i in range(len(bounds) - 1, -1, -1):
        hi = bounds[i + 1] if i + 1 < len(bounds) else end
        lo = max(bounds[i], start)
        if lo >= hi:
            if hi <= start:
                break
            continue
        part: list[AuditEvent] = []
        for rec in _read_range(plog, lo, hi):
            seen += 1
            if seen % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            e = _decode(rec)
            if e is not None and q.matches(e):
                part.append(e)
        found_events.extendleft(reversed(part))
        if len(found_events) >= limit or lo <= start:
            break
    return newest(list(found_events)[-limit:], limit)


def _batch(events: list[AuditEvent]) -> bytes:
    builder = BatchBuilder()
    for e in events:
        builder.append(_encoder.encode(e), timestamp_ms=e.time_ms)
    return builder.build()


def _read_range(plog: PartitionLog, lo: int, hi: int) -> Iterator[StoredRecord]:
    for rec in read_log(plog, lo):
        if rec.offset >= hi:
            return
        yield rec


def _decode(rec: StoredRecord) -> AuditEvent | None:
    if rec.value is None:
        return None
    try:
        return _decoder.decode(rec.value)
    except msgspec.DecodeError:
        log.warning("audit: record %d is not an audit event; skipped", rec.offset)
        return None


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the audit writer failed", exc_info=task.exception())
