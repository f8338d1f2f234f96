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
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from tidewire.broker import Broker
from tidewire.errors import TidewireError
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

#: How long a key is remembered after its first use (seconds): far longer than any client's
#: retry loop, short enough that reading it back after a restart stays cheap.
KEY_TTL_S = 3600.0
#: Keys remembered at once (all topics): about 200 bytes each, so 40 MB at most.
MAX_KEYS = 200_000
#: The longest key accepted (characters), as common HTTP APIs allow.
MAX_KEY_CHARS = 255
#: The record header that carries the key of a keyed publish.
KEY_HEADER = "idempotency-key"
#: The record header that carries a message's index in a keyed batch publish.
INDEX_HEADER = "idempotency-index"
#: Bytes of one partition read at a time while remembering keys after a start.
_SCAN_CHUNK = 1024 * 1024


@dataclass(slots=True)
class KeyEntry:
    """What one key's requests did.

    Attributes:
        fingerprint: the messages of the first request (None: unknown, read back from the log).
        placement: the partition of each message, as the first request chose.
        done: partition -> base offset of what was stored there.
        created: when the key was first used (monotonic seconds).
        lock: held while a request with this key runs.
    """

    fingerprint: int | None
    placement: list[int] | None
    done: dict[int, int] = field(default_factory=dict)
    created: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class IdempotencyStore:
    """The keys of one gateway: ``(topic, key)`` -> :class:`KeyEntry`, bounded in count and age.

    Args:
        broker: where a topic's keys are read back from after a start.
        ttl_s: how long a key is remembered.
        max_keys: how many keys are remembered at once.
    """

    def __init__(
        self, broker: Broker, *, ttl_s: float = KEY_TTL_S, max_keys: int = MAX_KEYS
    ) -> None:
        self.broker = broker
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._entries: OrderedDict[tuple[str, str], KeyEntry] = OrderedDict()
        self._recovered: dict[str, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def entry(self, topic: str, key: str) -> KeyEntry:
        """The entry of ``key`` in ``topic``, created (unlocked, empty) if new."""
        await self._recover(topic)
        self._expire()
        e = self._entries.get((topic, key))
        if e is None:
            e = self._entries[(topic, key)] = KeyEntry(None, None)
        return e

    def forget_topic(self, topic: str) -> None:
        """Forget a deleted topic's keys (a new topic of that name starts afresh)."""
        for k in [k for k in self._entries if k[0] == topic]:
            del self._entries[k]
        self._recovered.pop(topic, None)

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        entries = self._entries
        while entries:
            k, e = next(iter(entries.items()))
            if e.lock.locked() or (e.created > cutoff and len(entries) < self.max_keys):
                return
            del entries[k]

    async def _recover(self, topic: str) -> None:
        """Once per topic and process: remember the keys stored in the last ``ttl_s``."""
        fut = self._recovered.get(topic)
        if fut is None:
            fut = self._recovered[topic] = asyncio.get_running_loop().create_future()
            try:
                await self._scan(topic)
            except TidewireError:
                # Nothing to read back (no such topic yet, say): nothing to remember.
                pass
            finally:
                fut.set_result(None)
        elif not fut.done():
            await asyncio.shield(fut)

    async def _scan(self, topic: str) -> None:
        broker = self.broker
        since = int((time.time() - self.ttl_s) * 1000)
        for p in range(broker.partition_count(topic)):
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
            e = self._entries[(topic, key)] = KeyEntry(None, [])
            # Aged by its record's time, so it is forgotten when it would have been.
            e.created = time.monotonic() - max(time.time() - rec.timestamp / 1000, 0)
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
