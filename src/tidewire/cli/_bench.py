"""``tidewire bench produce|consume``: the load generator (like Kafka's perf-test tools and
``nats bench``).

``produce`` sends ``--messages`` messages of ``--size`` bytes through ``--producers``
:class:`~tidewire.client.AsyncProducer` instances (in this process, on one event loop) and
reports throughput and publish latency: the time from ``send`` to the acknowledgement that
``--acks`` asks for, measured on every 8th message (a callback on every message would cost
the producer more than the figure is worth). ``--rate`` paces the sends (messages per second,
all producers together) for latency at a given load.

``consume`` reads ``--messages`` messages (all partitions, from ``--from``: ``earliest`` by
default) with one :class:`~tidewire.client.AsyncConsumer` and reports throughput and the
end-to-end latency of each record (receipt time - the record's timestamp; for a catch-up read
of old messages that is their age, for a consumer following a producer it is the delivery
latency).

Both show a progress bar on stderr when it is a terminal, print a table, or with ``--json``
one JSON object with every figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tidewire.client import AsyncClient, AsyncConsumer, AsyncProducer, RecordFuture
from tidewire.client._subscriber import DEFAULT_CREDIT_BYTES
from tidewire.errors import TidewireError, TopicExistsError

from ._bench_e2e import STAMP, E2EResult, run_e2e, run_fast
from ._common import (
    DEFAULT_ADDR,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    AddrOption,
    JsonOption,
    check_addr,
    cli_credentials,
    cli_tls,
    echo_json,
    fail,
)

__all__ = ["bench_app"]

bench_app = typer.Typer(
    name="bench",
    help="Load generator: publish or consume at full speed and report throughput and latency.",
    no_args_is_help=True,
)

#: Every how many messages the publish latency is sampled.
LATENCY_SAMPLE = 8

# Options that produce and e2e share (their defaults differ).
BatchBytesOption = Annotated[
    int, typer.Option("--batch-bytes", min=1, help="A partition's batch is sent at this size.")
]
LingerOption = Annotated[
    int, typer.Option("--linger-ms", min=0, help="Or when its first message is this old.")
]
AcksOption = Annotated[str, typer.Option("--acks", help="none, leader or durable.")]
PartitionsOption = Annotated[
    int, typer.Option("--partitions", min=1, help="Partitions if the topic is created.")
]
RateOption = Annotated[
    int, typer.Option("--rate", min=0, help="Messages per second in all (0: unpaced).")
]


@dataclass
class BenchResult:
    """The figures of one run (the ``--json`` object)."""

    test: str
    topic: str
    messages: int
    size: int
    seconds: float
    msg_per_s: float
    mb_per_s: float
    latency_ms_p50: float
    latency_ms_p95: float
    latency_ms_p99: float
    latency_ms_max: float
    latency_samples: int
    settings: dict[str, object]


def _percentile(sorted_ms: Sequence[float], q: float) -> float:
    if not sorted_ms:
        return 0.0
    i = min(len(sorted_ms) - 1, max(0, round(q * (len(sorted_ms) - 1))))
    return round(sorted_ms[i], 3)


def _result(
    test: str,
    topic: str,
    messages: int,
    size: int,
    seconds: float,
    latencies_ms: list[float],
    settings: dict[str, object],
) -> BenchResult:
    lat = sorted(latencies_ms)
    rate = messages / seconds if seconds > 0 else 0.0
    return BenchResult(
        test=test,
        topic=topic,
        messages=messages,
        size=size,
        seconds=round(seconds, 4),
        msg_per_s=round(rate, 1),
        mb_per_s=round(rate * size / 1e6, 2),
        latency_ms_p50=_percentile(lat, 0.50),
        latency_ms_p95=_percentile(lat, 0.95),
        latency_ms_p99=_percentile(lat, 0.99),
        latency_ms_max=round(lat[-1], 3) if lat else 0.0,
        latency_samples=len(lat),
        settings=settings,
    )


def _progress(total: int, label: str, quiet: bool) -> Progress:
    return Progress(
        TextColumn(label),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.completed:,}/{task.total:,} msgs"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=quiet or not sys.stderr.isatty(),
        transient=True,
    )


def _print(result: BenchResult, as_json: bool) -> None:
    if as_json:
        echo_json(asdict(result))
        return
    table = Table(title=f"tidewire bench {result.test}: {result.topic}", show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("messages", f"{result.messages:,} x {result.size:,} B")
    table.add_row("time", f"{result.seconds:.2f} s")
    table.add_row("throughput", f"{result.msg_per_s:,.0f} msg/s, {result.mb_per_s:,.1f} MB/s")
    what = "publish" if result.test == "produce" else "end-to-end"
    table.add_row(
        f"{what} latency p50 / p95 / p99 / max",
        f"{result.latency_ms_p50:.2f} / {result.latency_ms_p95:.2f} / "
        f"{result.latency_ms_p99:.2f} / {result.latency_ms_max:.2f} ms",
    )
    table.add_row("settings", ", ".join(f"{k}={v}" for k, v in result.settings.items()))
    Console().print(table)


def _check_acks(acks: str) -> None:
    if acks not in ("none", "leader", "durable"):
        fail(f"--acks must be none, leader or durable, not {acks!r}", 2)


def _run(coro_factory: object) -> BenchResult:
    try:
        return run_fast(coro_factory)  # type: ignore[arg-type]
    except TidewireError as exc:
        fail(exc.message)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None


# --- produce --------------------------------------------------------------------------------------


@bench_app.command("produce")
def produce(
    topic: Annotated[str, typer.Option("--topic", help="Topic to publish to.")] = "bench",
    messages: Annotated[
        int, typer.Option("--messages", min=1, help="Messages in all.")
    ] = 1_000_000,
    size: Annotated[int, typer.Option("--size", min=0, help="Bytes of each value.")] = 1024,
    producers: Annotated[
        int, typer.Option("--producers", min=1, help="Producers, each with its own connection.")
    ] = 1,
    batch_bytes: BatchBytesOption = 256 * 1024,
    linger_ms: LingerOption = 5,
    acks: AcksOption = "durable",
    partitions: PartitionsOption = 1,
    rate: RateOption = 0,
    compression: Annotated[
        str, typer.Option("--compression", help="none, gzip, snappy, lz4 or zstd.")
    ] = "none",
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Publish at full speed (or at --rate) and report msg/s, MB/s and publish latency."""
    check_addr(addr)
    _check_acks(acks)
    settings: dict[str, object] = {
        "producers": producers,
        "batch_bytes": batch_bytes,
        "linger_ms": linger_ms,
        "acks": acks,
        "partitions": partitions,
        "rate": rate,
        "compression": compression,
    }
    result = _run(
        _produce(
            addr,
            topic,
            messages,
            size,
            producers,
            {
                "batch_bytes": batch_bytes,
                "linger_ms": linger_ms,
                "acks": acks,
                "compression": compression,
            },
            partitions,
            rate,
            settings,
            as_json,
        )
    )
    _print(result, as_json)
    if result.messages < messages:
        raise typer.Exit(EXIT_ERROR)


async def _ensure_topic(addr: str, topic: str, partitions: int) -> None:
    async with AsyncClient(addr, tls=cli_tls(), credentials=cli_credentials()) as client:
        with contextlib.suppress(TopicExistsError):
            await client.create_topic(topic, partitions=partitions)


async def _produce(
    addr: str,
    topic: str,
    messages: int,
    size: int,
    producers: int,
    options: dict[str, object],
    partitions: int,
    rate: int,
    settings: dict[str, object],
    quiet: bool,
) -> BenchResult:
    await _ensure_topic(addr, topic, partitions)
    value = os.urandom(size // 2 + 1).hex().encode()[:size]
    latencies: list[float] = []
    sent = [0]
    clients = [
        AsyncProducer(addr, tls=cli_tls(), credentials=cli_credentials(), **options)  # type: ignore[arg-type]
        for _ in range(producers)
    ]
    try:
        for p in clients:  # connect, learn the topic, get a producer id: not timed
            await (await p.send(topic, value))
        shares = [messages // producers + (i < messages % producers) for i in range(producers)]
        loop = asyncio.get_running_loop()
        per_producer_rate = rate / producers if rate else 0.0

        def sampled(t0: float) -> object:
            def done(fut: RecordFuture) -> None:
                if fut.exception() is None:
                    latencies.append((loop.time() - t0) * 1000)

            return done

        async def run(p: AsyncProducer, n: int) -> None:
            start = loop.time()
            fut: RecordFuture | None = None
            for i in range(n):
                if per_producer_rate:
                    due = start + i / per_producer_rate
                    if (ahead := due - loop.time()) > 0:
                        await asyncio.sleep(ahead)
                fut = await p.send(topic, value)
                if i % LATENCY_SAMPLE == 0:
                    fut.add_done_callback(sampled(loop.time()))  # type: ignore[arg-type]
                sent[0] += 1
            await p.flush()
            if fut is not None:
                await fut  # raises if the last batch failed

        with _progress(messages, "publishing", quiet) as progress:
            task = progress.add_task("publish", total=messages)

            async def report() -> None:
                while True:
                    progress.update(task, completed=sent[0])
                    await asyncio.sleep(0.2)

            reporter = asyncio.create_task(report())
            t0 = time.perf_counter()
            try:
                await asyncio.gather(*(run(p, n) for p, n in zip(clients, shares, strict=True)))
            finally:
                reporter.cancel()
            elapsed = time.perf_counter() - t0
    finally:
        for p in clients:
            await p.close(flush=False)
    return _result("produce", topic, messages, size, elapsed, latencies, settings)


# --- consume --------------------------------------------------------------------------------------


@bench_app.command("consume")
def consume(
    topic: Annotated[str, typer.Option("--topic", help="Topic to read.")] = "bench",
    messages: Annotated[
        int, typer.Option("--messages", min=1, help="Messages to read (all partitions).")
    ] = 1_000_000,
    start: Annotated[
        str, typer.Option("--from", help="earliest or latest (then waits for new messages).")
    ] = "earliest",
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.001, help="Stop after this long with no message.")
    ] = 10.0,
    max_bytes: Annotated[
        int, typer.Option("--max-bytes", min=1, help="Bytes per fetch, all partitions.")
    ] = 16 * 1024 * 1024,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Read messages as fast as they come and report msg/s, MB/s and end-to-end latency."""
    check_addr(addr)
    if start not in ("earliest", "latest"):
        fail(f"--from must be earliest or latest, not {start!r}", 2)
    settings: dict[str, object] = {"from": start, "max_bytes": max_bytes}
    result = _run(_consume(addr, topic, messages, start, timeout, max_bytes, settings, as_json))
    _print(result, as_json)
    if result.messages < messages:
        typer.echo(
            f"error: only {result.messages:,} of {messages:,} messages arrived "
            f"(none for {timeout:g} s)",
            err=True,
        )
        raise typer.Exit(EXIT_ERROR)


async def _consume(
    addr: str,
    topic: str,
    messages: int,
    start: str,
    timeout: float,
    max_bytes: int,
    settings: dict[str, object],
    quiet: bool,
) -> BenchResult:
    async with AsyncClient(addr, tls=cli_tls(), credentials=cli_credentials()) as client:
        n_parts = len((await client.describe_topic(topic)).partitions)
    latencies: list[float] = []
    got = size_sum = 0
    async with AsyncConsumer(
        addr,
        max_bytes=max_bytes,
        max_partition_bytes=max_bytes,
        tls=cli_tls(),
        credentials=cli_credentials(),
    ) as consumer:
        await consumer.assign([(topic, p, start) for p in range(n_parts)])
        with _progress(messages, "consuming", quiet) as progress:
            task = progress.add_task("consume", total=messages)
            t0 = time.perf_counter()
            last = t0
            while got < messages:
                records = await consumer.poll(timeout, max_records=10_000)
                if not records:
                    break
                now_ms = time.time() * 1000
                for r in records[: messages - got]:
                    size_sum += len(r.value or b"")
                    latencies.append(now_ms - r.timestamp)
                got += min(len(records), messages - got)
                last = time.perf_counter()
                progress.update(task, completed=got)
    size = size_sum // got if got else 0
    return _result("consume", topic, got, size, last - t0, latencies, settings)


# --- e2e ------------------------------------------------------------------------------------------


@bench_app.command("e2e")
def e2e(
    topic: Annotated[str, typer.Option("--topic", help="Topic to publish to and read.")] = "bench",
    messages: Annotated[
        int, typer.Option("--messages", min=1, help="Messages to publish.")
    ] = 100_000,
    size: Annotated[
        int, typer.Option("--size", min=STAMP, help="Bytes of each value (the first 8: a clock).")
    ] = 1024,
    consumers: Annotated[
        int, typer.Option("--consumers", min=1, help="Group members, each a process of its own.")
    ] = 2,
    delivery: Annotated[
        str, typer.Option("--delivery", help="push (the broker sends) or pull (long-poll).")
    ] = "push",
    credit_bytes: Annotated[
        int, typer.Option("--credit-bytes", min=1, help="With push, each member's credit.")
    ] = DEFAULT_CREDIT_BYTES,
    partitions: PartitionsOption = 4,
    rate: RateOption = 0,
    batch_bytes: BatchBytesOption = 256 * 1024,
    linger_ms: LingerOption = 1,
    acks: AcksOption = "durable",
    timeout: Annotated[
        float,
        typer.Option("--timeout", min=0.001, help="Give up after this long with no delivery."),
    ] = 10.0,
    backlog: Annotated[
        bool,
        typer.Option(
            "--backlog",
            help="Publish everything first, then time the group catching up.",
            show_default=False,
        ),
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Publish and consume in a group at once (or, with --backlog, one after the other);
    report delivered msg/s and the latency of every message from publish to delivery."""
    check_addr(addr)
    _check_acks(acks)
    if delivery not in ("push", "pull"):
        fail(f"--delivery must be push or pull, not {delivery!r}", 2)
    settings: dict[str, object] = {
        "consumers": consumers,
        "delivery": delivery,
        "partitions": partitions,
        "rate": rate,
        "batch_bytes": batch_bytes,
        "linger_ms": linger_ms,
        "acks": acks,
        "backlog": backlog,
    }
    if delivery == "push":
        settings["credit_bytes"] = credit_bytes

    async def main() -> E2EResult:
        await _ensure_topic(addr, topic, partitions)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed:,}/{task.total:,} msgs"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=as_json or not sys.stderr.isatty(),
            transient=True,
        ) as progress:
            pub = progress.add_task("published", total=messages)
            got = progress.add_task("delivered", total=messages)

            def show(published: int, delivered: int) -> None:
                progress.update(pub, completed=published)
                progress.update(got, completed=max(delivered - 1, 0))

            return await run_e2e(
                addr,
                topic,
                messages,
                size,
                consumers,
                delivery,
                credit_bytes,
                {"batch_bytes": batch_bytes, "linger_ms": linger_ms, "acks": acks},
                rate,
                timeout,
                settings,
                show,
                backlog,
                tls,
                credentials=creds,
            )

    tls = cli_tls()
    creds = cli_credentials()
    try:
        result = run_fast(main())
    except TidewireError as exc:
        fail(exc.message)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        echo_json(asdict(result))
    else:
        table = Table(title=f"tidewire bench e2e: {result.topic}", show_header=False)
        table.add_column("figure")
        table.add_column("value", justify="right")
        table.add_row("messages", f"{result.messages:,} x {result.size:,} B")
        table.add_row("published", f"{result.publish_msg_per_s:,.0f} msg/s")
        table.add_row(
            "delivered",
            f"{result.delivered:,} in {result.seconds:.2f} s: {result.msg_per_s:,.0f} msg/s, "
            f"{result.mb_per_s:,.1f} MB/s",
        )
        table.add_row("per consumer", " / ".join(f"{n:,}" for n in result.per_consumer))
        table.add_row(
            "CPU seconds: producer / consumers",
            f"{result.cpu_s_producer:.2f} / "
            + " / ".join(f"{c:.2f}" for c in result.cpu_s_consumers),
        )
        table.add_row("duplicates", f"{result.duplicates:,}")
        table.add_row(
            "publish-to-delivery p50 / p95 / p99 / p99.9 / max",
            f"{result.latency_ms_p50:.2f} / {result.latency_ms_p95:.2f} / "
            f"{result.latency_ms_p99:.2f} / {result.latency_ms_p999:.2f} / "
            f"{result.latency_ms_max:.2f} ms",
        )
        table.add_row("settings", ", ".join(f"{k}={v}" for k, v in result.settings.items()))
        Console().print(table)
    if result.delivered < messages:
        typer.echo(
            f"error: only {result.delivered:,} of {messages:,} messages were delivered "
            f"(none for {timeout:g} s)",
            err=True,
        )
        raise typer.Exit(EXIT_ERROR)
