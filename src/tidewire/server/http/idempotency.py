"""``Idempotency-Key``: a publish retried with the same key is stored once.

The first request with a key (per topic) decides where each of its messages goes; the
partitions stored are remembered with their base offsets. A retry with the same key and the
same messages answers those offsets without storing anything again; if the first attempt
stored only some partitions (a batch whose other partition failed), the retry stores only the
rest, in the partitions chosen the first time. A retry that arrives while the first attempt
is still running waits for it. A key sent again with different messages is refused (409).

Keys are remembered for :data:`KEY_TTL_S` after their first use, at most :data:`MAX_KEYS`
of them (the oldest are forgotten first). They also outlive a restart: every message stored
under a key carries the record header :data:`KEY_HEADER` (and, in a batch, its index in the
request in :data:`INDEX_HEADER`), and the first keyed publish to a topic after a start reads
back the last :data:`KEY_TTL_S` of that topic's partitions (by the time index) to remember
them again. A key found that way is matched by key only (its messages cannot be compared).

In a cluster a keyed publish is stored by the leader of its partitions (another node
redirects it there, see :mod:`.cluster`; a message without a key or a partition goes to the
partition of the Idempotency-Key's hash, so that a retry sent to any node reaches the same
leader), and the keys are that leader's: records replicate with their headers, so a node
that becomes a partition's leader reads back the last :data:`KEY_TTL_S` of it before it
stores a keyed publish there, once per leader epoch, after its high watermark has reached
the log end it had then (what the former leader acknowledged is in its log by the election
rules; until then keyed publishes are refused with a retriable error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from tidewire.broker import Broker
from tidewire.errors import NotEnoughReplicasError, TidewireError, UnknownTopicError
from tidewire.server.http.cluster import partition_count
from tidewire.server.http.reading import StoredRecord, read_partition

__all__ = [
    "INDEX_HEADER",
    "KEY_HEADER",
    "KEY_TTL_S",
    "MAX_KEYS",
    "MAX_KEY_CHARS",
    "IdempotencyStore",
    "KeyEntry",
]

log = logging.getLogger("tidewire.http")

#: How long a key is remembered after its first use (seconds): far longer than any client's
#: retry loop, short enough that reading it back after a restart stays cheap.
KEY_TTL_S = 3600.0
#: Keys remembered at once (all topics): about 650 bytes each, so 65 MB at most.
MAX_KEYS = 100_000
#: The longest key accepted (characters), as common HTTP APIs allow.
MAX_KEY_CHARS = 255
#: The record header that carries the key of a keyed publish.
KEY_HEADER = "idempotency-key"
#: The record header that carries a message's index in a keyed batch publish.
INDEX_HEADER = "idempotency-index"
#: How long a keyed publish waits, on a node that has just taken over a partition, for the
#: high watermark to reach the log end (s): the followers' next fetch moves it; a partition
#: below min_insync_replicas refuses the publish anyway.
TAKE_OVER_WAIT_S = 5.0
#: Bytes of one partition read at a time while remembering keys after a start.
_SCAN_CHUNK = 1024 * 1024


@dataclass(slots=True)
class KeyEntry:
    """What one key's requests did.

    Attributes:
        fingerprint: the messages of the first request (None: unknown, read back from the log).
        placement: the partition of each message, as the first request chose.
        done: partition -> base offset of what was stored there.
        created: when the key was first used (the store's clock, seconds).
    """

    fingerprint: int | None
    placement: list[int] | None
    created: float
    done: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Held:
    lock: asyncio.Lock
    users: int = 0  # requests holding or awaiting the lock


class IdempotencyStore:
    """The keys of one gateway: ``(topic, key)`` -> :class:`KeyEntry`, bounded in count and age.

    Args:
        broker: where a topic's keys are read back from after a start.
        ttl_s: how long a key is remembered.
        max_keys: how many keys are remembered at once.
        clock: seconds, monotonic: when keys were used and expire.
        wall_clock: seconds since the epoch: how far back to read after a start.
    """

    def __init__(
        self,
        broker: Broker,
        *,
        ttl_s: float = KEY_TTL_S,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.broker = broker
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self.clock = clock
        self.wall_clock = wall_clock
        self._entries: OrderedDict[tuple[str, str], KeyEntry] = OrderedDict()
        self._held: dict[tuple[str, str], _Held] = {}  # keys whose requests run or wait
        self._recovered: dict[str, asyncio.Future[None]] = {}
        #: In a cluster: (topic, partition) -> the leader epoch it was read back in, and the
        #: reading (done once it has been).
        self._led: dict[tuple[str, int], tuple[int, asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.asynccontextmanager
    async def hold(self, topic: str, key: str) -> AsyncIterator[KeyEntry]:
        """The entry of ``key`` in ``topic`` (created empty if new), held: one request with
        a key runs at a time, a retry waits for the attempt before it."""
        await self._recover(topic)
        k = (topic, key)
        held = self._held.get(k)
        if held is None:
            held = self._held[k] = _Held(asyncio.Lock())
        held.users += 1
        try:
            async with held.lock:
                self._expire()
                e = self._entries.get(k)
                if e is None:
                    e = self._entries[k] = KeyEntry(None, None, self.clock())
                yield e
        finally:
            held.users -= 1
            if not held.users:
                del self._held[k]

    def forget_topic(self, topic: str) -> None:
        """Forget a deleted topic's keys (a new topic of that name starts afresh)."""
        for k in [k for k in self._entries if k[0] == topic]:
            del self._entries[k]
        self._recovered.pop(topic, None)
        for led in [led for led in self._led if led[0] == topic]:
            del self._led[led]

    def _expire(self) -> None:
        cutoff = self.clock() - self.ttl_s
        entries = self._entries
        while entries:
            k, e = next(iter(entries.items()))
            if k in self._held or (e.created > cutoff and len(entries) < self.max_keys):
                return
            del entries[k]

    async def _recover(self, topic: str) -> None:
        """Once per topic and process: remember the keys stored in the last ``ttl_s``; in a
        cluster, of each partition led here, once per leader epoch."""
        if self.broker.replication is not None:
            await self._recover_led(topic)
            return
        fut = self._recovered.get(topic)
        if fut is None:
            fut = self._recovered[topic] = asyncio.get_running_loop().create_future()
            try:
                await self._scan(topic)
            except UnknownTopicError:
                pass  # a topic yet to be created has no keys
            except TidewireError as exc:  # the keys that could be read are remembered
                log.warning("reading back the idempotency keys of %s stopped: %s", topic, exc)
            finally:
                fut.set_result(None)
        elif not fut.done():
            await asyncio.shield(fut)

    async def _scan(self, topic: str) -> None:
        for p in range(self.broker.partition_count(topic)):
            await self._scan_partition(topic, p)

    async def _scan_partition(self, topic: str, p: int) -> None:
        broker = self.broker
        since = int((self.wall_clock() - self.ttl_s) * 1000)
        offset = broker.list_offset(topic, p, since)
        end = broker.high_watermark(topic, p)
        while offset < end:
            recs, offset = read_partition(
                broker, topic, p, offset, limit=1 << 30, max_bytes=_SCAN_CHUNK
            )
            if not recs:
                break
            for rec in recs:
                self._remember(topic, p, rec)
            await asyncio.sleep(0)  # let requests run between chunks

    async def _recover_led(self, topic: str) -> None:
        """A cluster's :meth:`_recover`: read back each partition of ``topic`` this node
        leads, once per leader epoch (what the other leaders stored under a key is in the
        replicated log).

        Raises:
            NotEnoughReplicasError: the high watermark of a partition just taken over has
                not reached its log end yet (retriable: nothing is stored meanwhile).
        """
        rep = self.broker.replication
        assert rep is not None
        try:
            n = partition_count(self.broker, topic) or 0
        except UnknownTopicError:
            return  # refused by the publish itself
        for p in range(n):
            t = topic
            plog = self.broker.logs.logs.get((t, p))
            if plog is None or not rep.leads(t, p):
                continue
            epoch = rep.leader_epoch(t, p)
            known = self._led.get((t, p))
            if known is not None and known[0] == epoch:
                if not known[1].done():
                    await asyncio.shield(known[1])
                continue
            fut = asyncio.get_running_loop().create_future()
            self._led[(t, p)] = (epoch, fut)
            try:
                await self._committed(t, p, plog.log_end_offset)
                await self._scan_partition(t, p)
            except BaseException:
                del self._led[(t, p)]  # read again by the next keyed publish
                raise
            finally:
                fut.set_result(None)

    async def _committed(self, topic: str, partition: int, end: int) -> None:
        """Wait (up to :data:`TAKE_OVER_WAIT_S`) until the high watermark of a partition this
        node now leads reaches ``end``, the log end it had when it took over.

        Raises:
            NotEnoughReplicasError: it did not.
        """
        broker = self.broker
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TAKE_OVER_WAIT_S
        while broker.high_watermark(topic, partition) < end:
            left = deadline - loop.time()
            if left <= 0:
                raise NotEnoughReplicasError(
                    f"partition {partition} of {topic!r} was taken over by this node and its "
                    f"high watermark {broker.high_watermark(topic, partition)} has not reached "
                    f"the log end {end} yet: a publish with an Idempotency-Key waits for that "
                    "(retry)"
                )
            await broker.wait_for_data([(topic, partition)], left)

    def _remember(self, topic: str, partition: int, rec: StoredRecord) -> None:
        key = index = None
        for hk, hv in rec.headers:
            if hk == KEY_HEADER and hv is not None:
                key = hv.decode("utf-8", "replace")
            elif hk == INDEX_HEADER and hv is not None and hv.isdigit():
                index = int(hv)
        if key is None:
            return
        e = self._entries.get((topic, key))
        if e is None:
            # Aged by its record's time, so it is forgotten when it would have been.
            age = max(self.wall_clock() - rec.timestamp / 1000, 0)
            e = self._entries[(topic, key)] = KeyEntry(None, [], self.clock() - age)
        if e.fingerprint is not None:
            return  # made by this process: it knows better
        placement = e.placement if e.placement is not None else []
        i = index or 0
        while len(placement) <= i:
            placement.append(-1)
        placement[i] = partition
        e.placement = placement
        base = e.done.get(partition)
        if base is None or rec.offset < base:
            e.done[partition] = rec.offset
