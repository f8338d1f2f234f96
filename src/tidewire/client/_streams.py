"""Lightweight streams from the clients: ``client.streams`` on
:class:`~tidewire.client.AsyncClient` (:class:`AsyncStreams`) and on its blocking twin
(:class:`Streams`).

- Sending: :meth:`AsyncStreams.send` one message (raising the error of its result), or
  :meth:`AsyncStreams.send_many` any number, cut into STREAM_SEND requests of at most
  :data:`~tidewire.protocol.messages.MAX_SEND_ITEMS` items and :data:`MAX_SEND_BYTES` bytes,
  up to :data:`SEND_PIPELINE` of them in flight at once; the results come back in order.
- Work-queue receiving: :meth:`AsyncStreams.receive` and :meth:`AsyncStreams.receive_many`
  (one request waits on many streams: a client is not a socket per stream). Taking is at
  most once: a connection lost while a receive waits is raised, never retried, since the
  broker may have handed that request a message.
- Fan-out reading by resume token: :meth:`AsyncStreams.read`, and
  :meth:`AsyncStreams.subscribe`, which loops long-poll reads and, when the connection is
  lost or the broker restarts, reads again from the tokens it holds (misses and repeats
  nothing).

In a cluster a stream is served by its *owner*, the leader of its partition of
:data:`STREAMS_TOPIC` (:func:`stream_partition`); other nodes answer NotLeaderError. The
client learns that from the first refusal (a single node never refuses, so it costs nothing
there), then asks the metadata for the owners and sends each stream's requests to its owner,
again after a failover (NotLeaderError, NotEnoughReplicasError: retried with backoff for up
to the request timeout). A send's items go to their owners in parallel; a receive or read
naming streams of several owners asks each in turn, without waiting first, then with long
polls of :data:`SPREAD_SLICE_MS` each, so it answers within that of a message arriving
anywhere (a receive never has two nodes' requests out at once: what it takes is returned).

A send refused by an owner that lost its lead after storing it (NotLeaderError once its
record is written, before the in-sync replicas acknowledged it) is sent again to the new
owner, which holds that record too. So that the retry stores nothing twice, in a cluster the
client gives every persistent item sent without a uuid one of its own (:data:`AUTO_UUID_PREFIX`,
the client's random id and a counter: unique, the same on every attempt); the owner dedupes
it as any uuid (``stream_dedup_window``, and from its records after an owner change), and a
retry found a duplicate is answered as stored (code 0, without a token: the first attempt
made it). In-memory items need none: they live on the owner that stored them, forgotten with
its lead. A single node gets the items as given (the client asks the metadata once, at its
first send, whether it talks to a cluster).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from tidewire.errors import (
    ConnectionLostError,
    NotEnoughReplicasError,
    NotLeaderError,
    RequestTimedOutError,
    TidewireError,
    for_code,
)
from tidewire.protocol.messages import (
    MAX_SEND_ITEMS,
    RING_SIZE_DEFAULT,
    SendItem,
    SendResult,
    StreamDescribeRequest,
    StreamInfo,
    StreamListRequest,
    StreamMessage,
    StreamReadRequest,
    StreamReceiveRequest,
    StreamSendRequest,
    StreamStats,
)

from ._routing import Router, backoff_s
from ._transport import Transport

__all__ = [
    "AUTO_UUID_PREFIX",
    "DUPLICATE",
    "FROM_END",
    "FROM_START",
    "MAX_SEND_BYTES",
    "SEND_PIPELINE",
    "SPREAD_SLICE_MS",
    "STREAMS_TOPIC",
    "AsyncStreams",
    "Streams",
    "stream_partition",
]

T = TypeVar("T")

log = logging.getLogger("tidewire.client")

#: The token that reads a stream from its oldest retained persistent message.
FROM_START = ""
#: The token that reads only what is sent after the read began.
FROM_END = "$"
#: ``SendResult.code`` of a send whose uuid the stream had seen: nothing was stored.
DUPLICATE = -1
#: The start of the uuid a client gives, in a cluster, a persistent item sent without one
#: (followed by the client's random id, a dash and a counter in hex): see the module docstring.
AUTO_UUID_PREFIX = "tw-"
#: Bytes of values one STREAM_SEND carries at most (a larger single value goes alone): far
#: below the broker's frame limit (64 MiB by default).
MAX_SEND_BYTES = 8 * 1024 * 1024
#: STREAM_SEND requests one ``send_many`` has in flight at once: enough to keep the broker
#: busy while the client encodes the next one and decodes the answers, few enough to keep
#: the client's memory at a few requests.
SEND_PIPELINE = 4
#: The longest pause between two attempts of a subscription's read after a failure, s.
MAX_RETRY_BACKOFF_S = 2.0
#: A subscription's first pause after a failure, s (doubled up to the bound above).
FIRST_RETRY_BACKOFF_S = 0.05
#: The broker's topic of persistent stream messages: in a cluster a stream's owner is the
#: leader of its partition (the broker's ``tidewire.broker.offsets``; the client does not
#: import the broker, and a test pins that both agree).
STREAMS_TOPIC = "__streams"
#: In a cluster, the long poll one owner gets in turn when a receive or read names streams
#: of several owners (ms): a message arriving at any of them is answered within about this
#: times the owners asked.
SPREAD_SLICE_MS = 100
#: Per-item or per-request refusals after which a cluster's request goes to the stream's
#: owner again (nothing was stored or taken).
_REROUTE = (NotLeaderError.code, NotEnoughReplicasError.code)


def stream_partition(stream: str, partitions: int) -> int:
    """The partition of :data:`STREAMS_TOPIC` that holds ``stream`` (its owner's)."""
    return zlib.crc32(stream.encode("utf-8", "surrogatepass")) % partitions


def _check(body: Any) -> Any:
    if body.error_code:
        raise for_code(body.error_code)(body.error_message)
    return body


def _value(value: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a message value is bytes or str, not {type(value).__name__}")


def _item(x: SendItem | tuple[Any, ...]) -> SendItem:
    if type(x) is SendItem:
        return x
    if isinstance(x, tuple):
        if not 2 <= len(x) <= 5:
            raise TypeError(
                f"a send item is (stream, value[, uuid, ttl_ms, persistent]), not {len(x)} values"
            )
        return SendItem(x[0], _value(x[1]), *x[2:])
    raise TypeError(f"a send item is a SendItem or a tuple, not {type(x).__name__}")


def _ring(ring_size: int | None) -> int:
    return RING_SIZE_DEFAULT if ring_size is None else ring_size


def _streams(streams: str | Iterable[str]) -> list[str]:
    return [streams] if isinstance(streams, str) else list(streams)


def _chunks(items: Iterable[SendItem | tuple[Any, ...]]) -> Iterator[list[SendItem]]:
    """``items`` cut into request-sized lists (see :data:`MAX_SEND_BYTES`)."""
    chunk: list[SendItem] = []
    size = 0
    for x in items:
        item = _item(x)
        n = len(item.value) + len(item.stream) + len(item.uuid)
        if chunk and (len(chunk) >= MAX_SEND_ITEMS or size + n > MAX_SEND_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        yield chunk


class _Gathering:
    """The items of :meth:`AsyncStreams.send` calls of one loop turn with equal settings."""

    __slots__ = ("futures", "items", "size")

    def __init__(self) -> None:
        self.items: list[SendItem] = []
        self.futures: list[asyncio.Future[SendResult]] = []
        self.size = 0


class _Coalescer:
    """Gathers the :meth:`AsyncStreams.send` calls of one loop turn with equal ``ring_size``
    and ``block_ms`` into one STREAM_SEND (up to :data:`MAX_SEND_ITEMS` items and
    :data:`MAX_SEND_BYTES`; more start another), so that many tasks sending one message
    each cost a request per turn, not a request each."""

    def __init__(self, streams: AsyncStreams) -> None:
        self._streams = streams
        self._open: dict[tuple[int, int], _Gathering] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0  # STREAM_SEND requests sent for send() calls (for tests)

    def add(self, item: SendItem, ring: int, block_ms: int) -> asyncio.Future[SendResult]:
        loop = asyncio.get_running_loop()
        key = (ring, block_ms)
        n = len(item.value) + len(item.stream) + len(item.uuid)
        g = self._open.get(key)
        if g is not None and g.size + n > MAX_SEND_BYTES:
            self._start(key, self._open.pop(key))
            g = None
        if g is None:
            g = self._open[key] = _Gathering()
        fut: asyncio.Future[SendResult] = loop.create_future()
        g.items.append(item)
        g.futures.append(fut)
        g.size += n
        if len(g.items) >= MAX_SEND_ITEMS:
            self._start(key, self._open.pop(key))
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        groups, self._open = self._open, {}
        for key, g in groups.items():
            self._start(key, g)

    def _start(self, key: tuple[int, int], g: _Gathering) -> None:
        task = asyncio.get_running_loop().create_task(
            self._request(key, g), name="tidewire stream send"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _request(self, key: tuple[int, int], g: _Gathering) -> None:
        self.requests += 1
        try:
            results = await self._streams._send(g.items, *key)
        except TidewireError as exc:
            for fut in g.futures:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except BaseException:
            for fut in g.futures:
                fut.cancel()
            raise
        for fut, result in zip(g.futures, results, strict=True):
            if not fut.done():  # its caller may have stopped waiting
                fut.set_result(result)


class AsyncStreams:
    """The stream methods of an :class:`~tidewire.client.AsyncClient` (``client.streams``)."""

    def __init__(self, transport: Transport, router: Router | None = None) -> None:
        self._t = transport
        self._coalescer = _Coalescer(self)
        #: routes to each stream's owner in a cluster (None: every request to ``transport``)
        self._router = router
        #: partitions of the cluster's STREAMS_TOPIC, once learned (0: not yet)
        self._partitions = 0
        #: whether the first send asked the metadata if the client talks to a cluster
        self._probed = False
        #: the uuids given to persistent items sent without one in a cluster (see the
        #: module docstring): this prefix, unique to the client, and a counter
        self._auto_prefix = f"{AUTO_UUID_PREFIX}{os.urandom(8).hex()}-"
        self._auto_count = itertools.count(1)

    def _timeout(self, wait_ms: int) -> float:
        return self._t.request_timeout_s + max(wait_ms, 0) / 1000

    # --- routing in a cluster -------------------------------------------------------------------

    def _clustered(self) -> bool:
        return self._router is not None and self._router.clustered

    async def _learn(self) -> None:
        """Ask the metadata for :data:`STREAMS_TOPIC`: its partition count and leaders (the
        node asked makes the topic when it does not exist yet: asked again later)."""
        assert self._router is not None
        try:
            meta = await self._router.refresh([STREAMS_TOPIC])
        except (ConnectionLostError, RequestTimedOutError):
            return  # no node answered: the next attempt asks again
        for desc in meta.topics:
            if desc.name == STREAMS_TOPIC and not desc.error_code and desc.partitions:
                self._partitions = len(desc.partitions)

    async def _owner_of(self, stream: str, attempt: int) -> Transport:
        """The connection to ``stream``'s owner (the client's own while unknown); from the
        second attempt on, after a pause and a look at the metadata."""
        assert self._router is not None
        if attempt:
            await asyncio.sleep(backoff_s(attempt))
        if attempt or not self._partitions:
            await self._learn()
        if not self._partitions:
            return self._t
        return self._router.transport_for(STREAMS_TOPIC, stream_partition(stream, self._partitions))

    def _forget(self, streams: Iterable[str]) -> None:
        if self._router is not None and self._partitions:
            for p in {stream_partition(s, self._partitions) for s in streams}:
                self._router.forget(STREAMS_TOPIC, p)

    async def _by_owner(
        self, streams: Iterable[str], attempt: int
    ) -> list[tuple[Transport, list[str]]]:
        """``streams`` grouped by their owners' connections (see :meth:`_owner_of`)."""
        groups: dict[int, tuple[Transport, list[str]]] = {}
        for stream in streams:
            t = await self._owner_of(stream, attempt)
            attempt = 0  # paused and learned once per call
            groups.setdefault(id(t), (t, []))[1].append(stream)
        return list(groups.values())

    async def _send_to(
        self,
        transport: Transport,
        items: list[SendItem],
        ring_size: int,
        block_ms: int,
        tokens: bool,
    ) -> list[SendResult]:
        req = StreamSendRequest(items=items, ring_size=ring_size, block_ms=block_ms, tokens=tokens)
        response = await transport.request(req, timeout_s=self._timeout(block_ms))
        assert response is not None
        results: list[SendResult] = _check(response.body).results
        if len(results) != len(items):
            raise TidewireError(f"{len(results):,} results for {len(items):,} items sent")
        return results

    async def _probe(self) -> None:
        """Once, at the first send: ask the metadata whether the client talks to a cluster
        (and learn ``__streams`` there), so that even the first sends get their uuids
        (:meth:`_with_ids`). No answer: taken as a single node (a refusal naming an owner
        routes the send all the same)."""
        self._probed = True
        if self._router is None or self._router.clustered:
            return
        try:
            await self._learn()
        except TidewireError as exc:  # e.g. not allowed to describe: routed on a refusal
            log.debug("streams: the metadata did not answer the cluster probe: %s", exc)

    def _with_ids(self, items: list[SendItem]) -> tuple[list[SendItem], set[int]]:
        """``items`` with a uuid of the client's own given to each persistent one sent
        without one, and the indexes of those (see the module docstring)."""
        auto: set[int] = set()
        out = items
        for k, it in enumerate(items):
            if it.persistent and not it.uuid:
                if not auto:
                    out = list(items)
                auto.add(k)
                uid = f"{self._auto_prefix}{next(self._auto_count):x}"
                out[k] = SendItem(it.stream, it.value, uid, it.ttl_ms, it.persistent)
        return out, auto

    async def _send(
        self, items: list[SendItem], ring_size: int, block_ms: int, tokens: bool = True
    ) -> list[SendResult]:
        auto: set[int] = set()
        if self._router is not None:
            if not self._probed:
                await self._probe()
            if self._router.clustered:
                items, auto = self._with_ids(items)
        if not self._clustered():
            results = await self._send_to(self._t, items, ring_size, block_ms, tokens)
            if self._router is None or not any(r.code in _REROUTE for r in results):
                return results
            first: list[SendResult | None] = list(results)  # a cluster: some go elsewhere
        else:
            first = [None] * len(items)
        results = await self._send_routed(items, first, ring_size, block_ms, tokens)
        for k in auto:  # its uuid is the client's: a duplicate is an earlier attempt's store
            if results[k].code == DUPLICATE:
                results[k] = SendResult(0, "", "")
        return results

    async def _send_routed(
        self,
        items: list[SendItem],
        results: list[SendResult | None],
        ring_size: int,
        block_ms: int,
        tokens: bool,
    ) -> list[SendResult]:
        """Send each item still without a result, or refused by a node that does not own
        its stream, to its owner, the owners' parts in parallel; again after a pause while
        owners refuse, for up to the request timeout (then their refusals are the results).
        A lost connection is raised (its items may be stored)."""
        deadline = time.monotonic() + self._t.request_timeout_s
        rounds = 0
        todo = [k for k, r in enumerate(results) if r is None or r.code in _REROUTE]
        if len(todo) < len(items):
            rounds = 1  # a node refused some: look at the metadata first
        while todo:
            groups: dict[int, tuple[Transport, list[int]]] = {}
            attempt = rounds  # (the pause and the look at the metadata: once a round)
            for k in todo:
                t = await self._owner_of(items[k].stream, attempt)
                attempt = 0
                groups.setdefault(id(t), (t, []))[1].append(k)
            parts = list(groups.values())
            answers = await asyncio.gather(
                *(
                    self._send_to(t, [items[k] for k in ks], ring_size, block_ms, tokens)
                    for t, ks in parts
                ),
                return_exceptions=True,
            )
            retry: list[int] = []
            for (_, ks), answer in zip(parts, answers, strict=True):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, NotLeaderError | NotEnoughReplicasError):
                        raise answer
                    refusal = SendResult(answer.code, answer.message, "")
                    for k in ks:
                        results[k] = refusal
                    retry += ks
                    continue
                for k, r in zip(ks, answer, strict=True):
                    results[k] = r
                    if r.code in _REROUTE:
                        retry.append(k)
            self._forget(items[k].stream for k in retry)
            todo = retry
            if time.monotonic() >= deadline:
                break
            rounds += 1
        out: list[SendResult] = []
        for result in results:
            assert result is not None
            out.append(result)
        return out

    async def _call_owners(
        self,
        streams: list[str],
        wait_ms: int,
        call: Callable[[Transport, list[str], int], Coroutine[Any, Any, T]],
        got_any: Callable[[T], bool],
        merge: Callable[[list[T]], T],
    ) -> T:
        """``call(transport, streams, wait_ms)`` at ``streams``' owners (see the module
        docstring): one owner, one call; several, in turn, first without waiting, then
        with long polls of :data:`SPREAD_SLICE_MS` until ``wait_ms`` is over, up to the
        first round whose answers hold something (``got_any``), merged. Refused by a node
        that does not own a stream (nothing taken), it asks again after a pause, for up to
        the request timeout; anything else is raised."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_ms / 1000
        retry_until = time.monotonic() + self._t.request_timeout_s
        attempt = 0
        while True:
            left = max(0, int((until - loop.time()) * 1000))
            try:
                owners = await self._by_owner(streams, attempt)
                if len(owners) == 1:
                    return await call(owners[0][0], owners[0][1], left)
                slice_ms = 0
                while True:
                    answers = []
                    for t, part in owners:
                        answer = await call(t, part, slice_ms)
                        answers.append(answer)
                        if got_any(answer):
                            return merge(answers)
                    left = max(0, int((until - loop.time()) * 1000))
                    if left <= 0:
                        return merge(answers)
                    slice_ms = min(left, SPREAD_SLICE_MS)
            except (NotLeaderError, NotEnoughReplicasError):
                attempt += 1
                if time.monotonic() >= retry_until:
                    raise
                self._forget(streams)

    async def send(
        self,
        stream: str,
        value: bytes | str,
        *,
        uuid: str = "",
        ttl_ms: int = 0,
        persistent: bool = False,
        ring_size: int | None = None,
        block_ms: int = 0,
    ) -> SendResult:
        """Send one message to ``stream`` (created by it if it does not exist). Calls made
        in the same loop turn with equal ``ring_size`` and ``block_ms`` travel as one
        request, each with its own result.

        Args:
            value: the message (a str is sent as UTF-8).
            uuid: deduplicates: a send whose uuid is among the stream's recent ones stores
                nothing (its result's ``code`` is :data:`DUPLICATE`).
            ttl_ms: the message expires that long after the broker stored it (0: the
                broker's ``stream_default_ttl_ms``; at most ``stream_max_ttl_ms``).
            persistent: written durably (answered once durable per the broker's fsync
                policy) and readable by token; otherwise kept in memory only.
            ring_size: the bound of waiting messages of a stream this send creates (None:
                the broker's ``stream_ring_size``).
            block_ms: with the ring full, wait up to this long for room (0: push the oldest
                waiting message out).

        Returns:
            the result: ``token`` is the resume token of a persistent message.

        Raises:
            InvalidStreamError: a bad stream id, TTL or argument.
            StreamFullError: the ring stayed full for ``block_ms`` (retriable).
            TooManyStreamsError: the broker holds its maximum of streams (retriable).
        """
        item = SendItem(stream, _value(value), uuid, ttl_ms, persistent)
        result = await self._coalescer.add(item, _ring(ring_size), block_ms)
        if result.code > 0:
            raise for_code(result.code)(result.message)
        return result

    async def send_many(
        self,
        items: Iterable[SendItem | tuple[Any, ...]],
        *,
        ring_size: int | None = None,
        block_ms: int = 0,
        tokens: bool = True,
    ) -> list[SendResult]:
        """Send many messages, each to its own stream, and return one result per item, in
        order (per-item errors are in the results, as ``code`` and ``message``; nothing is
        raised for them).

        Args:
            items: :class:`SendItem` objects, or tuples ``(stream, value[, uuid, ttl_ms,
                persistent])``. They are sent as requests of at most 10,000 items (and
                :data:`MAX_SEND_BYTES`), :data:`SEND_PIPELINE` of them in flight at once.
            ring_size, block_ms: as for :meth:`send`, for every item.
            tokens: False: the results of persistent items carry no ``token`` (the broker
                makes and sends none: a sender that never reads by token saves that work).

        Raises:
            TidewireError: a request failed as a whole (the log failed, the connection was
                lost): the items of earlier requests may have been stored.
        """
        ring = _ring(ring_size)
        pending: list[asyncio.Task[list[SendResult]]] = []
        out: list[SendResult] = []
        try:
            for chunk in _chunks(items):
                if len(pending) >= SEND_PIPELINE:
                    out += await pending.pop(0)
                pending.append(asyncio.ensure_future(self._send(chunk, ring, block_ms, tokens)))
            while pending:
                out += await pending.pop(0)
        finally:
            for task in pending:  # a failure: the others' answers are not waited for
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        return out

    async def receive(
        self, stream: str, *, wait_ms: int = 0, ring_size: int | None = None
    ) -> StreamMessage | None:
        """Take the oldest waiting message of ``stream`` (work-queue mode: no other receiver
        gets it), waiting up to ``wait_ms`` for one; None when none came.

        Raises:
            InvalidStreamError: a bad stream id, or ``wait_ms`` above the broker's
                ``stream_max_wait_ms``.
            ConnectionLostError: the connection broke while waiting (a message the broker
                handed this receive then is lost: receiving is at most once).
        """
        got = await self.receive_many([stream], wait_ms=wait_ms, ring_size=ring_size)
        return got[0] if got else None

    async def receive_many(
        self,
        streams: str | Iterable[str],
        *,
        max_messages: int = 1,
        wait_ms: int = 0,
        ring_size: int | None = None,
    ) -> list[StreamMessage]:
        """Take up to ``max_messages`` waiting messages of any of ``streams`` (oldest first
        per stream), in one request that returns as soon as any of them has one, or with
        ``[]`` after ``wait_ms``. Raises as :meth:`receive`."""
        names = _streams(streams)
        ring = _ring(ring_size)

        async def call(t: Transport, part: list[str], wait: int) -> list[StreamMessage]:
            req = StreamReceiveRequest(
                streams=part, max_messages=max_messages, wait_ms=wait, ring_size=ring
            )
            response = await t.request(req, timeout_s=self._timeout(wait))
            assert response is not None
            return list(_check(response.body).messages)

        if not self._clustered():
            t0 = time.monotonic()
            try:
                return await call(self._t, names, wait_ms)
            except NotLeaderError:
                if self._router is None:
                    raise
                # a cluster, and the node asked does not own them: nothing was taken
                wait_ms = max(0, wait_ms - int((time.monotonic() - t0) * 1000))

        def merge(answers: list[list[StreamMessage]]) -> list[StreamMessage]:
            return [m for a in answers for m in a]

        return await self._call_owners(names, wait_ms, call, bool, merge)

    async def read(
        self, positions: Mapping[str, str], *, max_messages: int = 100, wait_ms: int = 0
    ) -> tuple[list[StreamMessage], dict[str, str]]:
        """Read persistent messages (fan-out mode: nothing is taken) of each stream from its
        token (:data:`FROM_START`, :data:`FROM_END` or a token a read returned), waiting up
        to ``wait_ms`` when there are none.

        Returns:
            the messages (each with the token after it) and, for every stream asked, the
            token to read it from next.

        Raises:
            InvalidStreamError: a bad stream id or token (a token of another stream).
        """
        asked = dict(positions)
        Answer = tuple[list[StreamMessage], dict[str, str]]

        async def call(t: Transport, part: list[str], wait: int) -> Answer:
            req = StreamReadRequest(
                positions={s: asked[s] for s in part}, max_messages=max_messages, wait_ms=wait
            )
            response = await t.request(req, timeout_s=self._timeout(wait))
            assert response is not None
            body = _check(response.body)
            return list(body.messages), dict(body.tokens)

        if not self._clustered():
            t0 = time.monotonic()
            try:
                return await call(self._t, list(asked), wait_ms)
            except NotLeaderError:
                if self._router is None:
                    raise
                wait_ms = max(0, wait_ms - int((time.monotonic() - t0) * 1000))

        def merge(answers: list[Answer]) -> Answer:
            tokens = dict(asked)
            messages: list[StreamMessage] = []
            for got, toks in answers:
                messages += got
                tokens.update(toks)
            return messages, tokens

        return await self._call_owners(list(asked), wait_ms, call, lambda a: bool(a[0]), merge)

    def subscribe(
        self,
        stream: str | Mapping[str, str],
        from_token: str = FROM_START,
        *,
        wait_ms: int = 30_000,
        max_messages: int = 100,
    ) -> AsyncIterator[StreamMessage]:
        """Every persistent message of ``stream`` from ``from_token`` on, as it comes,
        forever (fan-out mode); ``stream`` may be a mapping of streams to their tokens.

        It loops long-poll reads of up to ``wait_ms``. A lost connection, a timeout or a
        retriable error is retried (with a growing pause, up to 2 s) from the tokens
        held, so a broker restart misses and repeats nothing. Each message carries the
        token after it: keep the last one to resume later.

        Raises (from the iteration):
            InvalidStreamError and other errors that are not retriable.
        """
        positions = {stream: from_token} if isinstance(stream, str) else dict(stream)
        return _subscription(self, positions, max_messages, wait_ms)

    async def list(self, prefix: str = "", *, limit: int = 1000) -> list[StreamInfo]:
        """The streams whose ids start with ``prefix`` (at most ``limit``, sorted by id)
        that this client may describe; asked for page by page (in a cluster, of every node:
        each lists the streams it owns)."""
        if self._router is not None:
            return await _list_every_node(self._router, prefix, limit)
        out: list[StreamInfo] = []
        after = ""
        while len(out) < limit:
            req = StreamListRequest(prefix=prefix, after=after, limit=min(limit - len(out), 1000))
            response = await self._t.request(req)
            assert response is not None
            body = _check(response.body)
            out += body.streams
            if not body.last:
                break
            after = body.last
        return out[:limit]

    async def describe(self, stream: str) -> StreamInfo | None:
        """What the broker holds of ``stream`` now (in a cluster: its owner); None when it
        does not exist (never sent to, or forgotten when empty and idle)."""

        async def call(t: Transport, part: list[str], wait: int) -> StreamInfo | None:
            response = await t.request(StreamDescribeRequest(stream=stream))
            assert response is not None
            info: StreamInfo | None = _check(response.body).info
            return info

        if not self._clustered():
            try:
                return await call(self._t, [stream], 0)
            except NotLeaderError:
                if self._router is None:
                    raise
        return await self._call_owners([stream], 0, call, lambda _: True, lambda a: a[0])

    async def stats(self) -> StreamStats:
        """Counts over every stream (needs describe on the cluster; in a cluster, the sums
        over every node)."""
        if self._router is not None:
            bodies = await self._router.ask_every_node(StreamDescribeRequest())
            every = [_check(b).stats or StreamStats() for b in bodies]
            fields = StreamStats.__struct_fields__
            return StreamStats(**{f: sum(getattr(s, f) for s in every) for f in fields})
        response = await self._t.request(StreamDescribeRequest())
        assert response is not None
        stats: StreamStats | None = _check(response.body).stats
        return stats if stats is not None else StreamStats()


async def _list_every_node(router: Router, prefix: str, limit: int) -> list[StreamInfo]:
    """:meth:`list` over every node (one node: its pages, as before): each round asks
    every node for the page after ``after`` and keeps what lies at or below the
    smallest id a node with more ended its page at (below it, every node has answered
    all it holds)."""
    out: list[StreamInfo] = []
    after = ""
    while len(out) < limit:
        want = min(limit - len(out), 1000)
        req = StreamListRequest(prefix=prefix, after=after, limit=want)
        bodies = [_check(b) for b in await router.ask_every_node(req)]
        merged = sorted((i for b in bodies for i in b.streams), key=lambda i: i.stream)
        ends = [b.last for b in bodies if b.last]
        cutoff = min(ends) if ends else None
        eligible = [i for i in merged if cutoff is None or i.stream <= cutoff]
        take = eligible[:want]
        out += take
        if len(take) < len(eligible):
            after = take[-1].stream
        elif cutoff is None:
            break
        else:
            after = cutoff
    return out[:limit]


def _retriable(exc: TidewireError) -> bool:
    return exc.retriable or isinstance(exc, (ConnectionLostError, RequestTimedOutError))


class _Reader:
    """The state of a subscription: the token of each stream, and the read that advances
    them (retried on failures that may pass)."""

    def __init__(
        self, streams: AsyncStreams, positions: dict[str, str], max_messages: int, wait_ms: int
    ) -> None:
        self.streams = streams
        self.positions = positions
        self.max_messages = max_messages
        self.wait_ms = wait_ms
        self.retries = 0  # reads retried after a failure (for tests and statistics)

    async def next_batch(self) -> list[StreamMessage]:
        backoff = FIRST_RETRY_BACKOFF_S
        while True:
            try:
                messages, tokens = await self.streams.read(
                    self.positions, max_messages=self.max_messages, wait_ms=self.wait_ms
                )
            except TidewireError as exc:
                if not _retriable(exc):
                    raise
                self.retries += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_RETRY_BACKOFF_S)
                continue
            # Only streams asked for: the positions are never widened by an answer.
            for name, token in tokens.items():
                if name in self.positions:
                    self.positions[name] = token
            return messages


async def _subscription(
    streams: AsyncStreams, positions: dict[str, str], max_messages: int, wait_ms: int
) -> AsyncIterator[StreamMessage]:
    reader = _Reader(streams, positions, max_messages, wait_ms)
    while True:
        for message in await reader.next_batch():
            yield message


class Streams:
    """The blocking twin of :class:`AsyncStreams` (``client.streams`` of the blocking
    :class:`~tidewire.client.Client`): the same methods, called without await."""

    def __init__(
        self, streams: AsyncStreams, run: Callable[[Coroutine[Any, Any, Any]], Any]
    ) -> None:
        self._async = streams
        self._run = run

    def send(
        self,
        stream: str,
        value: bytes | str,
        *,
        uuid: str = "",
        ttl_ms: int = 0,
        persistent: bool = False,
        ring_size: int | None = None,
        block_ms: int = 0,
    ) -> SendResult:
        """See :meth:`AsyncStreams.send`."""
        result: SendResult = self._run(
            self._async.send(
                stream,
                value,
                uuid=uuid,
                ttl_ms=ttl_ms,
                persistent=persistent,
                ring_size=ring_size,
                block_ms=block_ms,
            )
        )
        return result

    def send_many(
        self,
        items: Iterable[SendItem | tuple[Any, ...]],
        *,
        ring_size: int | None = None,
        block_ms: int = 0,
        tokens: bool = True,
    ) -> list[SendResult]:
        """See :meth:`AsyncStreams.send_many` (``items`` are read in this thread)."""
        batch = [_item(x) for x in items]
        results: list[SendResult] = self._run(
            self._async.send_many(batch, ring_size=ring_size, block_ms=block_ms, tokens=tokens)
        )
        return results

    def receive(
        self, stream: str, *, wait_ms: int = 0, ring_size: int | None = None
    ) -> StreamMessage | None:
        """See :meth:`AsyncStreams.receive`."""
        got: StreamMessage | None = self._run(
            self._async.receive(stream, wait_ms=wait_ms, ring_size=ring_size)
        )
        return got

    def receive_many(
        self,
        streams: str | Iterable[str],
        *,
        max_messages: int = 1,
        wait_ms: int = 0,
        ring_size: int | None = None,
    ) -> list[StreamMessage]:
        """See :meth:`AsyncStreams.receive_many`."""
        got: list[StreamMessage] = self._run(
            self._async.receive_many(
                _streams(streams), max_messages=max_messages, wait_ms=wait_ms, ring_size=ring_size
            )
        )
        return got

    def read(
        self, positions: Mapping[str, str], *, max_messages: int = 100, wait_ms: int = 0
    ) -> tuple[list[StreamMessage], dict[str, str]]:
        """See :meth:`AsyncStreams.read`."""
        got: tuple[list[StreamMessage], dict[str, str]] = self._run(
            self._async.read(dict(positions), max_messages=max_messages, wait_ms=wait_ms)
        )
        return got

    def subscribe(
        self,
        stream: str | Mapping[str, str],
        from_token: str = FROM_START,
        *,
        wait_ms: int = 30_000,
        max_messages: int = 100,
    ) -> Iterator[StreamMessage]:
        """See :meth:`AsyncStreams.subscribe`: a generator, each read run on the client's
        loop."""
        positions = {stream: from_token} if isinstance(stream, str) else dict(stream)
        reader = _Reader(self._async, positions, max_messages, wait_ms)
        while True:
            batch: list[StreamMessage] = self._run(reader.next_batch())
            yield from batch

    def list(self, prefix: str = "", *, limit: int = 1000) -> list[StreamInfo]:
        """See :meth:`AsyncStreams.list`."""
        got: list[StreamInfo] = self._run(self._async.list(prefix, limit=limit))
        return got

    def describe(self, stream: str) -> StreamInfo | None:
        """See :meth:`AsyncStreams.describe`."""
        got: StreamInfo | None = self._run(self._async.describe(stream))
        return got

    def stats(self) -> StreamStats:
        """See :meth:`AsyncStreams.stats`."""
        got: StreamStats = self._run(self._async.stats())
        return got
