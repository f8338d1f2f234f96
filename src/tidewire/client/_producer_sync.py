""":class:`Producer`, the blocking twin of :class:`~tidewire.client.AsyncProducer`.

It runs an :class:`AsyncProducer` (its sender, its connection) on an event loop in a thread
of its own, like :class:`~tidewire.client.Client`. ``send`` itself does not cross to that
thread: it appends to the accumulator (thread-safe) from the caller's thread and wakes the
sender only when a batch opens, so a message costs a few microseconds, not a round trip
between threads. Waiting for buffer room blocks the caller; metadata is fetched on the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from opentelemetry.trace import Tracer

from tidewire.client._blocking import BlockingTwin
from tidewire.errors import ProducerClosedError, TidewireError
from tidewire.observability import tracing as _tracing
from tidewire.observability.tracing import tracer as _tracer
from tidewire.security.credentials import Credentials
from tidewire.security.tls import TlsOptions

from ._accumulator import Accumulator, BlockingRecordFuture, ProducerBatch
from ._producer import _NEED_METADATA, AsyncProducer, Session, _new_tuple
from ._routing import RoutingStats
from ._settings import DEFAULT_BATCH_BYTES, ProducerSettings
from ._transport import Addresses, parse_addrs

__all__ = ["Producer"]

T = TypeVar("T")


class Producer(BlockingTwin[AsyncProducer]):
    """The blocking twin of :class:`AsyncProducer`: the same options and methods, called
    without ``await``; ``send`` returns a :class:`BlockingRecordFuture` (``.result(timeout)``).

    Use as ``with Producer(addr) as producer``. Thread-safe: any thread may ``send``.
    """

    _closed_error = ProducerClosedError
    _closed_message = "the producer is closed"

    def __init__(
        self,
        addr: Addresses = "127.0.0.1:7400",
        *,
        linger_ms: int = 5,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        buffer_bytes: int = 32 * 1024 * 1024,
        max_block_ms: int = 60_000,
        compression: str = "none",
        acks: str = "durable",
        idempotence: bool = True,
        retries: int = 2**31 - 1,
        delivery_timeout_ms: int = 120_000,
        retry_backoff_ms: int = 100,
        max_in_flight_per_partition: int = 5,
        pipeline_partial_batches: bool = False,
        request_timeout_ms: int = 30_000,
        max_request_bytes: int = 1024 * 1024,
        metadata_max_age_ms: int = 300_000,
        connect_timeout_ms: int = 10_000,
        writer_id: str | None = None,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        options: dict[str, Any] = {
            "linger_ms": linger_ms,
            "batch_bytes": batch_bytes,
            "buffer_bytes": buffer_bytes,
            "max_block_ms": max_block_ms,
            "compression": compression,
            "acks": acks,
            "idempotence": idempotence,
            "retries": retries,
            "delivery_timeout_ms": delivery_timeout_ms,
            "retry_backoff_ms": retry_backoff_ms,
            "max_in_flight_per_partition": max_in_flight_per_partition,
            "pipeline_partial_batches": pipeline_partial_batches,
            "request_timeout_ms": request_timeout_ms,
            "max_request_bytes": max_request_bytes,
            "metadata_max_age_ms": metadata_max_age_ms,
            "connect_timeout_ms": connect_timeout_ms,
            "writer_id": writer_id,
        }
        # Bad settings fail here, before a thread is started.
        parse_addrs(addr)
        ProducerSettings(**options)
        TlsOptions.of(tls)
        options["tls"] = tls
        options["credentials"] = credentials
        self._space = threading.Condition()
        self._start_loop("tidewire-producer")
        try:
            self._async, self._acc = self._run(self._make(addr, options))
        except BaseException:
            self._stop_loop()
            raise

    async def _make(
        self, addr: Addresses, options: dict[str, Any]
    ) -> tuple[AsyncProducer, Accumulator]:
        producer = AsyncProducer(addr, **options)
        producer._on_space.append(self._space)
        return producer, producer._bind(blocking=True)

    @property
    def session(self) -> Session:
        return self._async.session

    @property
    def producer_id(self) -> int:
        return self._async.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._async.producer_epoch

    @property
    def skipped(self) -> int:
        """See :attr:`AsyncProducer.skipped`."""
        return self._async.skipped

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: list[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> BlockingRecordFuture:
        """See :meth:`AsyncProducer.send`; blocks (up to ``max_block_ms``) only when the
        buffer is full or the topic's metadata is not known yet."""
        p = self._async
        t = _tracer()  # None without an OpenTelemetry SDK: nothing else is done for tracing
        if t is not None:
            return self._send_traced(t, topic, value, key, headers, partition, timestamp)
        if (
            (routed := p._append_routed) is not None  # first: the pure codec's one check
            and headers is None
            and partition is None
            and timestamp is None
        ):
            # As AsyncProducer.send: one compiled call (under the accumulator's lock).
            fut = routed(
                p._topics, topic, key, value, time.time_ns(), self._acc, BlockingRecordFuture
            )
            if fut is not None:
                return fut  # type: ignore[no-any-return]
        got = p._append(self._acc, topic, value, key, headers, partition, timestamp)
        if type(got) is tuple:
            return _new_tuple(BlockingRecordFuture, got)
        return BlockingRecordFuture(
            *self._send_slowly(
                topic, value, key=key, headers=headers, partition=partition, timestamp=timestamp
            )
        )

    def send_values(
        self, topic: str, values: Sequence[bytes | None], *, timestamp: int | None = None
    ) -> None:
        """See :meth:`AsyncProducer.send_values`; blocks only when the buffer is full or the
        topic's metadata is not known yet."""
        p = self._async
        ts = time.time_ns() // 1_000_000 if timestamp is None else timestamp
        deadline = time.monotonic() + p._settings.max_block_ms / 1000
        i, refreshed = 0, False
        while i < len(values):
            with self._space:
                got = p._append_values(self._acc, topic, values, i, ts)
                if got != _NEED_METADATA:
                    if got < len(values):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise p._buffer_full(len(values[got] or b""))
                        self._space.wait(remaining)
                    i = got
                    continue
            if refreshed:
                raise p._no_partition(topic, None)
            self._run(p._load_topic(topic, p._metadata_wait_s(deadline - time.monotonic())))
            refreshed = True

    @property
    def throttle_time_ms_total(self) -> int:
        """See :attr:`AsyncProducer.throttle_time_ms_total`."""
        return self._async.throttle_time_ms_total

    @property
    def routing_stats(self) -> RoutingStats:
        """See :attr:`AsyncProducer.routing_stats`."""
        return self._async.routing_stats

    @property
    def failure(self) -> TidewireError | None:
        """See :attr:`AsyncProducer.failure`."""
        return self._async.failure

    def _send_traced(  # noqa: PLR0917
        self,
        t: Tracer,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
        partition: int | None,
        timestamp: int | None,
    ) -> BlockingRecordFuture:
        """:meth:`send` with a publish span, its context written into the headers."""
        p = self._async
        span, headers = _tracing.start_publish(t, topic, headers, partition, p._addr)
        try:
            got = p._append(self._acc, topic, value, key, headers, partition, timestamp)
            if type(got) is not tuple:
                got = self._send_slowly(
                    topic, value, key=key, headers=headers, partition=partition, timestamp=timestamp
                )
        except BaseException as exc:
            _tracing.end_span(span, exc)
            raise
        batch, index, ts = got
        _tracing.finish_publish(span, batch.future, batch.state.partition, index)
        return BlockingRecordFuture(batch, index, ts)

    def _send_slowly(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
        partition: int | None,
        timestamp: int | None,
    ) -> tuple[ProducerBatch, int, int]:
        p = self._async
        deadline = time.monotonic() + p._settings.max_block_ms / 1000
        refreshed = False
        while True:
            with self._space:
                got = p._append(self._acc, topic, value, key, headers, partition, timestamp)
                if isinstance(got, tuple):
                    return got
                if got != _NEED_METADATA:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise p._buffer_full(got)
                    self._space.wait(remaining)
                    continue
            if refreshed:
                raise p._no_partition(topic, partition)
            self._run(p._load_topic(topic, p._metadata_wait_s(deadline - time.monotonic())))
            refreshed = True

    def flush(self, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncProducer.flush`."""
        self._run(self._async.flush(timeout_s))

    def close(self, *, flush: bool = True, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncProducer.close`; also stops the producer's thread."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._async.close(flush=flush, timeout_s=timeout_s))
        finally:
            self._stop_loop()
