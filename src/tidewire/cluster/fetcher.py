"""The follower side of replication: one :class:`LeaderFetcher` per leader node copies every
partition this node follows from that leader, over one connection, in one REPLICA_FETCH per
round (a long poll: the leader answers as soon as it has something, or after
``fetch_max_wait_ms``).

Each round names, per partition, the follower's log end (where to copy from), its fsynced
end (which the leader counts under ``fsync=always``), the leader epoch it follows in and the
epoch of its own last batch. The answer's batches are appended exactly as the leader holds
them (:meth:`~tidewire.storage.log.PartitionLog.append_replica_async`); a divergence answer
(KIP-101) truncates the log first (:func:`~tidewire.cluster.epochs.truncation_point`). The
broker's idempotent-producer state follows both (``Broker.replica_appended`` and
``replica_truncated``), so a follower promoted to leader knows every producer's sequences.
Before each round a followed partition's own log is checked: what it held before following
is CRC-checked a little at a time, and a damaged range, whenever found, is cut with all
after it so the round copies it again (``ReplicaManager.check_replica``).

A follower whose log end is below the leader's log start (the leader's retention deleted
what it would copy next) deletes its log and starts it over at the leader's log start
(Kafka's ``truncateFullyAndStartAt``).

Errors: a lost connection is reopened with capped exponential backoff; a partition answered
with FencedLeaderEpoch or NotLeader is paused until the node layer names its leader again
(``become_follower``); UnknownLeaderEpoch (the leader has not learned its election yet) and
other errors are retried after a backoff.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tidewire._tasks import cancel_and_wait, wait_event
from tidewire.client._transport import Transport
from tidewire.cluster.epochs import truncation_point
from tidewire.errors import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    FencedLeaderEpochError,
    NotLeaderError,
    TidewireError,
)
from tidewire.protocol.messages import (
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
)

if TYPE_CHECKING:
    from tidewire.cluster.replication import ReplicaManager
    from tidewire.security.credentials import Credentials
    from tidewire.security.tls import TlsOptions

__all__ = [
    "Connect",
    "FollowedPartition",
    "LeaderFetcher",
    "ReplicaLink",
    "default_connect",
    "node_connect",
]

log = logging.getLogger(__name__)

#: Backoff after an error (seconds): doubled per failure in a row, up to the cap, with jitter.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
#: Extra time the request may take beyond the long poll before it counts as lost.
REQUEST_MARGIN_S = 10.0
#: Bytes of their own logs the followed partitions of one round CRC-check together at most
#: (see ``ReplicaManager.check_replica``), so a restart's check does not hold up copying.
CHECK_BYTES_PER_ROUND = 4 * 1024 * 1024


class ReplicaLink(Protocol):
    """A protocol connection to a leader: :class:`tidewire.client._transport.Transport` is
    one (opened on first use, reopened after a failure)."""

    async def request(self, body: Any, data: Any = (), *, timeout_s: float | None = None) -> Any:
        """Send ``body``; return the response (``.body``, ``.data``)."""
        ...

    async def close(self) -> None: ...


#: Opens a link to a leader at ``(host, port)``.
Connect = Callable[[str, int], ReplicaLink]


def default_connect(host: str, port: int) -> ReplicaLink:
    """A plaintext, unauthenticated client transport to ``host:port``."""
    return Transport(f"{host}:{port}", connect_timeout_s=5.0, request_timeout_s=30.0)


def node_connect(
    *, tls: TlsOptions | None = None, credentials: Credentials | None = None
) -> Connect:
    """Opens links to leaders as this node's own identity: over TLS when ``tls`` is given
    (the leader's certificate verified against its CA, a client certificate presented if
    it names one), authenticated with ``credentials`` (SCRAM by default, as any client) when
    given. The leader's gate then checks ``cluster_action`` on the cluster for
    REPLICA_FETCH."""

    def connect(host: str, port: int) -> ReplicaLink:
        return Transport(
            f"{host}:{port}",
            connect_timeout_s=5.0,
            request_timeout_s=30.0,
            tls=tls,
            credentials=credentials,
        )

    return connect


@dataclass
class FollowedPartition:
    """A partition this node follows: in which leader epoch, from which leader."""

    topic: str
    partition: int
    epoch: int
    leader: int
    address: tuple[str, int]
    #: answered FencedLeaderEpoch/NotLeader: not fetched until the node layer says again
    paused: bool = False
    #: not fetched before this loop time (after an error of this partition)
    retry_at: float = 0.0
    failures: int = field(default=0)

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


class LeaderFetcher:
    """Copies the partitions this node follows from one leader node (a task of its own,
    started on the first :meth:`add`)."""

    def __init__(self, manager: ReplicaManager, leader: int, address: tuple[str, int]) -> None:
        self.manager = manager
        self.leader = leader
        self.address = address
        self.partitions: dict[tuple[str, int], FollowedPartition] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._link: ReplicaLink | None = None
        self._failures = 0
        #: rounds completed (tests and status)
        self.rounds = 0

    def add(self, state: FollowedPartition) -> None:
        """Fetch ``state``'s partition too (replacing an older state of it)."""
        self.partitions[state.key] = state
        self._changed.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"replica-fetcher-{self.leader}"
            )

    def remove(self, key: tuple[str, int]) -> None:
        self.partitions.pop(key, None)
        self._changed.set()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        link, self._link = self._link, None
        if link is not None:
            await link.close()

    # --- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            now = loop.time()
            wanted = [s for s in self.partitions.values() if not s.paused and s.retry_at <= now]
            if not wanted:
                later = [s.retry_at for s in self.partitions.values() if not s.paused]
                await self._wait_changed(max(min(later) - now, 0.01) if later else None)
                continue
            try:
                await self._round(wanted)
                self._failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost, timeout, the leader refused it all
                self._failures += 1
                delay = _backoff(self._failures)
                if isinstance(exc, AuthenticationFailedError | AuthorizationFailedError):
                    # Not transient: the operator has to act. Said loudly on the first
                    # refusal, then again now and then while it lasts.
                    if self._failures == 1 or self._failures % 50 == 0:
                        log.error(
                            "node %d cannot copy from leader node %d at %s:%d: %s. A node "
                            "authenticates to its leaders with --node-api-key-file (or a "
                            "client certificate), as a principal allowed cluster_action on the "
                            'cluster (docs/cluster.md, "Security")',
                            self.manager.node_id,
                            self.leader,
                            *self.address,
                            exc,
                        )
                    await self._wait_changed(delay)
                    continue
                log.info(
                    "replica fetch from node %d at %s:%d failed (%s); again in %.2f s",
                    self.leader,
                    *self.address,
                    exc,
                    delay,
                )
                await self._wait_changed(delay)

    async def _wait_changed(self, timeout_s: float | None) -> None:
        """Until :meth:`add` or :meth:`remove` changes the partitions, or ``timeout_s``
        passed. Not ``asyncio.wait_for``: in Python 3.11 it returns normally when the
        cancellation of :meth:`close` arrives in the turn the event is set (a partition
        removed just before), the cancellation is lost, and the loop would wait for ever
        with no partition left, ``close`` with it."""
        if timeout_s is None:
            await self._changed.wait()
        else:
            await wait_event(self._changed, timeout_s)

    async def _round(self, wanted: list[FollowedPartition]) -> None:
        m = self.manager
        parts: list[ReplicaFetchPartition] = []
        sent: list[FollowedPartition] = []
        budget = CHECK_BYTES_PER_ROUND
        for s in wanted:
            try:
                plog = m.broker.log(s.topic, s.partition)
            except TidewireError as exc:
                log.warning("cannot follow %s/%s: %s", s.topic, s.partition, exc)
                s.paused = True
                continue
            try:
                # The log is checked and cut at any damaged range first: the offset asked
                # for (the log end) then never lies past a hole.
                budget -= m.check_replica(s.topic, s.partition, plog, max(budget, 0))
            except TidewireError as exc:
                s.failures += 1
                s.retry_at = asyncio.get_running_loop().time() + _backoff(s.failures)
                log.warning("%s/%s: cannot check the log: %s", s.topic, s.partition, exc)
                continue
            parts.append(
                ReplicaFetchPartition(
                    s.topic,
                    s.partition,
                    plog.log_end_offset,
                    s.epoch,
                    plog.epoch_history().latest,
                    plog.flushed_offset,
                )
            )
            sent.append(s)
        if not parts:
            return
        if self._link is None:
            self._link = m.connect(*self.address)
        req = ReplicaFetchRequest(
            node_id=m.node_id, max_wait_ms=m.fetch_max_wait_ms, partitions=parts
        )
        got = await self._link.request(req, timeout_s=m.fetch_max_wait_ms / 1000 + REQUEST_MARGIN_S)
        body: ReplicaFetchResponse = got.body
        data = memoryview(got.data)
        pos = 0
        by_key = {s.key: (s, p) for s, p in zip(sent, parts, strict=True)}
        for r in body.partitions:
            chunk = data[pos : pos + r.data_bytes]
            pos += r.data_bytes
            entry = by_key.get((r.topic, r.partition))
            if entry is None:
                continue
            s, asked = entry
            if m.following(s.key) is not s:
                continue  # the role changed while the fetch was out: its answer is stale
            try:
                await self._apply(s, asked, r, chunk)
            except TidewireError as exc:  # this partition's log refused: the others go on
                s.failures += 1
                s.retry_at = asyncio.get_running_loop().time() + _backoff(s.failures)
                log.warning(
                    "%s/%s: cannot apply the leader's answer: %s", s.topic, s.partition, exc
                )
        self.rounds += 1

    async def _apply(
        self, s: FollowedPartition, asked: ReplicaFetchPartition, r: Any, chunk: memoryview
    ) -> None:
        m = self.manager
        loop = asyncio.get_running_loop()
        if r.error_code:
            if r.error_code in (FencedLeaderEpochError.code, NotLeaderError.code):
                # The leader knows a later epoch, or it is not the leader (any more): wait for
                # the node layer to name the partition's leader again.
                log.info("%s/%s paused: %s", s.topic, s.partition, r.error_message)
                s.paused = True
            else:
                s.failures += 1
                s.retry_at = loop.time() + _backoff(s.failures)
                log.info("%s/%s: %s; again later", s.topic, s.partition, r.error_message)
            return
        s.failures = 0
        plog = m.broker.log(s.topic, s.partition)
        if asked.offset < r.log_start_offset and not len(chunk):
            # The leader's retention deleted the offsets this log would copy next: nothing
            # below its log start can be copied any more, so this log starts over there.
            log.info(
                "%s/%s: log end %d is below leader %d's log start %d: deleting this log and "
                "copying from %d",
                s.topic,
                s.partition,
                asked.offset,
                s.leader,
                r.log_start_offset,
                r.log_start_offset,
            )
            plog.truncate_fully_and_start_at(r.log_start_offset)
            m.broker.replica_truncated(s.topic, s.partition, r.log_start_offset)
            m.learned(s.key, r.high_watermark)
            return
        if plog.log_start_offset < r.log_start_offset <= plog.log_end_offset:
            # The leader deleted below its log start (retention, or a queue's settled
            # messages): so does this replica, whole segments only (Kafka's follower does).
            try:
                plog.delete_before(r.log_start_offset)
            except TidewireError as exc:  # tried again at the next answer
                log.warning("%s/%s: segments not deleted: %s", s.topic, s.partition, exc)
        if r.diverging_end_offset >= 0:
            cut = truncation_point(
                plog.epoch_history(),
                plog.log_end_offset,
                (r.diverging_epoch, r.diverging_end_offset),
            )
            if cut < plog.log_end_offset:
                log.info(
                    "%s/%s: truncating %d..%d (diverged from leader %d, epoch %d ends at %d)",
                    s.topic,
                    s.partition,
                    cut,
                    plog.log_end_offset,
                    s.leader,
                    r.diverging_epoch,
                    r.diverging_end_offset,
                )
                plog.truncate_to(cut)
                m.broker.replica_truncated(s.topic, s.partition, cut)
            elif r.diverging_end_offset < plog.log_end_offset:
                # The leader lacks this log's last epoch and its own end of it is past the
                # leader's: cut at the leader's end.
                plog.truncate_to(r.diverging_end_offset)
                m.broker.replica_truncated(s.topic, s.partition, r.diverging_end_offset)
            else:  # nothing to cut, yet a divergence: do not spin on it
                s.failures += 1
                s.retry_at = asyncio.get_running_loop().time() + _backoff(s.failures)
            return
        if len(chunk) and asked.offset == plog.log_end_offset:
            # The producer state learns the batches before their append is awaited (it is
            # queued in the same step), so no produce taken in between, after a promotion,
            # misses them; an append that fails is forgotten again.
            m.broker.replica_appended(s.topic, s.partition, chunk)
            try:
                await plog.append_replica_async(chunk)
            except asyncio.CancelledError:
                raise  # the writes were queued: they are stored, as the state says
            except BaseException:
                m.broker.replica_truncated(s.topic, s.partition, plog.log_end_offset)
                raise
        m.learned(s.key, r.high_watermark)


def _backoff(failures: int) -> float:
    base: float = min(BACKOFF_MIN_S * 2.0 ** min(failures - 1, 10), BACKOFF_MAX_S)
    jitter: float = random.uniform(0.5, 1.0)
    return base * jitter
