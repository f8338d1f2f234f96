"""What tracing costs the publishing client: one producer's throughput in three modes, side by
side, in interleaved rounds, medians and ratios.

Usage::

    python benchmarks/tracing_overhead.py [--messages N] [--rounds R] [--value-bytes B]
        [--addr HOST:PORT]

Modes:

- ``untraced``: ``AsyncProducer.send`` as it was before tracing, with no tracing code at all
  (the method replaced, for this mode only, by a copy without the tracer check): the
  baseline;
- ``noop``: the code as shipped, with OpenTelemetry's API alone (no SDK: what every user of
  the clients runs unless they install and configure the SDK): one ``tracer()`` check per
  send;
- ``sdk``: an SDK tracer provider given to tidewire (``use_tracer_provider``), sampling
  everything, spans handed to a ``BatchSpanProcessor`` whose exporter drops them: a span per
  send, its ``traceparent`` written into the record's headers, the span ended when the batch
  is acknowledged.

Without ``--addr`` it starts a broker (``python -m tidewire serve --fsync never``) in a
process of its own (see ``producer_bench.py``). Each round runs the modes one after another
(the order rotating), each sending N messages of ``--value-bytes`` with ``acks=leader`` and
timing from the first send to the end of ``flush()``. It prints each round, then the median
messages/s of each mode and its ratio to ``untraced``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from producer_bench import run, serve
from tidewire import tracing
from tidewire.client import AsyncProducer, RecordFuture
from tidewire.client._accumulator import Accumulator

MODES = ("untraced", "noop", "sdk")


class _Drop(SpanExporter):
    """Exports nothing: the cost measured is making the spans, not shipping them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_shipped_send = AsyncProducer.send


async def _untraced_send(
    self: AsyncProducer,
    topic: str,
    value: bytes | None,
    *,
    key: bytes | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
    partition: int | None = None,
    timestamp: int | None = None,
) -> RecordFuture:
    """``AsyncProducer.send`` without the tracer check (the code before tracing)."""
    acc: Accumulator = self._acc or self._bind()
    got: Any = self._append(acc, topic, value, key, headers, partition, timestamp)
    if type(got) is tuple:
        if self._wake.is_set():
            await asyncio.sleep(0)
        return RecordFuture(*got)
    return RecordFuture(
        *(
            await self._send_slowly(
                acc,
                topic,
                value,
                key=key,
                headers=headers,
                partition=partition,
                timestamp=timestamp,
            )
        )
    )


async def publish(addr: str, topic: str, n: int, value: bytes) -> float:
    """Messages per second of one producer sending ``n`` values."""
    async with AsyncProducer(addr, acks="leader", batch_bytes=256 * 1024, linger_ms=5) as p:
        await (await p.send(topic, value))  # connection and metadata, untimed
        start = time.perf_counter()
        for _ in range(n):
            await p.send(topic, value)
        await p.flush()
        return n / (time.perf_counter() - start)


def one(mode: str, addr: str, args: argparse.Namespace, value: bytes) -> float:
    provider: TracerProvider | None = None
    if mode == "untraced":
        AsyncProducer.send = _untraced_send  # type: ignore[method-assign]
    elif mode == "sdk":
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(_Drop(), max_queue_size=65_536))
        tracing.use_tracer_provider(provider)
    try:
        assert (tracing.tracer() is not None) == (mode == "sdk")
        return run(publish(addr, "bench-tracing", args.messages, value))
    finally:
        AsyncProducer.send = _shipped_send  # type: ignore[method-assign]
        tracing.use_tracer_provider(None)
        if provider is not None:
            provider.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--addr", default=None)
    args = ap.parse_args()
    value = b"x" * args.value_bytes
    results: dict[str, list[float]] = {m: [] for m in MODES}

    def rounds(addr: str) -> None:
        for r in range(args.rounds):
            order = MODES[r % 3 :] + MODES[: r % 3]
            line = []
            for mode in order:
                rate = one(mode, addr, args, value)
                results[mode].append(rate)
                line.append(f"{mode} {rate:,.0f}")
            print(f"round {r + 1}: " + ", ".join(line) + " msg/s", flush=True)

    if args.addr:
        rounds(args.addr)
    else:
        with serve("--fsync", "never", "--partitions", "1") as b:
            rounds(b.addr)
    base = statistics.median(results["untraced"])
    print(
        f"medians over {args.rounds} rounds of {args.messages:,} messages of "
        f"{args.value_bytes} bytes:"
    )
    for mode in MODES:
        med = statistics.median(results[mode])
        print(f"  {mode:<9} {med:>12,.0f} msg/s   {med / base:6.1%} of untraced")


if __name__ == "__main__":
    main()
