"""``tidewire consume``: print a topic's (or a queue's) messages as they arrive.

Every partition (or the one ``--partition`` names) is read by a task of its own with
long-poll fetches, into one bounded queue that the printer drains; so a quiet partition
never holds back a busy one, and a slow terminal slows the fetches instead of growing memory.
Messages of one partition are printed in offset order.

``--format json`` prints one object per line::

    {"topic": "t", "partition": 0, "offset": 7, "timestamp": 1714564800000,
     "key": "k", "value": "v", "headers": [{"key": "h", "value": "x"}]}

With ``--group G`` the command is a member of consumer group ``G``
(:class:`~tidewire.client.AsyncGroupConsumer`): it reads the partitions the group assigns it,
from the group's committed offsets, and commits the position after the last message printed
every 5 s and when it stops.

With ``--queue Q`` it takes a queue's messages instead (:mod:`._queue_messages`): each is
printed, then acknowledged (``--nack``: requeued, ``--reject``: dead-lettered).

``key``, ``value`` and header values are UTF-8 text, ``null`` when absent; one that is not
valid UTF-8 is base64 instead, and a flag beside it says so: ``"key_base64": true``,
``"value_base64": true``, ``"value_base64": true`` inside a header.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import json
import re
import time
from dataclasses import dataclass
from typing import Annotated

import typer

from tidewire.client import AsyncClient, AsyncGroupConsumer, Gap
from tidewire.client._queue_consumer import MAX_PREFETCH
from tidewire.errors import PartitionCorruptError, TidewireError, UnknownPartitionError
from tidewire.records import Record

from ._common import (
    DEFAULT_ADDR,
    EXIT_USAGE,
    AddrOption,
    cli_credentials,
    cli_tls,
    fail,
    run_client,
)
from ._queue_messages import DEFAULT_PREFETCH, Settle, consume_queue
from ._queue_messages import text_or_base64 as _text

__all__ = ["consume", "parse_since", "record_doc"]

#: Messages fetched and not yet printed, across partitions: the bound on memory when the
#: output is slower than the broker (each partition task waits for room).
QUEUE_MAX = 10_000
#: How long one fetch waits for new data on the broker (ms). Short enough that a partition's
#: request does not hold a connection slot for long; long enough to cost little when idle.
LONG_POLL_MS = 1000
#: Bytes one fetch asks for per partition.
FETCH_MAX_BYTES = 1024 * 1024

#: The list_offset timestamps that mean "the first offset" and "the end".
EARLIEST = -2
LATEST = -1

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_RELATIVE = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d|w)\s*$")
#: A bare integer: ms since the epoch (ISO-8601's basic dates are not taken: 20240501 is a
#: timestamp in 1970, so write dates as 2024-05-01).
_EPOCH_MS = re.compile(r"^\s*\d+\s*$")


#: The --help panel of the options that apply to --queue.
_QUEUE_PANEL = "Queues (--queue)"


class Format(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def parse_since(text: str, now_ms: int) -> int:
    """A ``--since`` value as a timestamp in ms since the epoch.

    Args:
        text: ISO-8601 (``2024-05-01T12:00:00Z``, ``2024-05-01``; local time when it has no
            offset), ms since the epoch (a bare integer: ``1714564800000``, as Kafka's tools
            and record timestamps write it) or a duration back from ``now_ms``: a number and
            a unit among ``ms``, ``s``, ``m``, ``h``, ``d``, ``w`` (``10m``, ``2h``).
        now_ms: the present, ms since the epoch.

    Raises:
        ValueError: none of these forms.
    """
    m = _RELATIVE.match(text)
    if m:
        return now_ms - int(m.group(1)) * _UNITS_MS[m.group(2)]
    if _EPOCH_MS.match(text):
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r} is neither ISO-8601 (2024-05-01T12:00:00Z), ms since the epoch "
            "(1714564800000) nor a duration (30s, 10m, 2h, 1d)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time, as a person typing a date means it
    return int(when.timestamp() * 1000)


def record_doc(topic: str, partition: int, rec: Record) -> dict[str, object]:
    """The JSON object ``--format json`` prints for one record."""
    doc: dict[str, object] = {
        "topic": topic,
        "partition": partition,
        "offset": rec.offset,
        "timestamp": rec.timestamp,
    }
    for name, data in (("key", rec.key), ("value", rec.value)):
        doc[name], b64 = _text(data)
        if b64:
            doc[f"{name}_base64"] = True
    headers: list[dict[str, object]] = []
    for k, v in rec.headers:
        value, b64 = _text(v)
        h: dict[str, object] = {"key": k, "value": value}
        if b64:
            h["value_base64"] = True
        headers.append(h)
    doc["headers"] = headers
    return doc


@dataclass(frozen=True, slots=True)
class _Start:
    """Where to start reading: ``offset`` itself, or a list_offset timestamp."""

    offset: int | None = None
    timestamp: int = LATEST


async def _poll(
    client: AsyncClient,
    topic: str,
    partition: int,
    offset: int,
    queue: asyncio.Queue[tuple[int, Record] | TidewireError],
    skip_damaged: bool = False,
) -> None:
    """Fetch one partition from ``offset`` on, forever, into ``queue``; a failure goes into
    the queue too, for the printer to report. With ``skip_damaged``, a damaged range of the
    log is read past, reported on stderr."""
    try:
        while True:
            try:
                got = await client.fetch(
                    topic, partition, offset, max_bytes=FETCH_MAX_BYTES, max_wait_ms=LONG_POLL_MS
                )
            except PartitionCorruptError as exc:
                if not skip_damaged or exc.damage_end <= offset:
                    raise
                _report_gap(Gap(topic, partition, offset, exc.damage_end))
                offset = exc.damage_end
                continue
            for rec in got.records:
                await queue.put((partition, rec))
            offset = got.next_offset
    except TidewireError as exc:
        await queue.put(exc)


def _report_gap(gap: Gap) -> None:
    typer.echo(
        f"gap: {gap.topic} partition {gap.partition} offsets {gap.start}..{gap.end - 1} "
        "lie in a damaged range of the log and were skipped",
        err=True,
    )


async def _consume(
    client: AsyncClient,
    topic: str,
    partition: int | None,
    start: _Start,
    count: int | None,
    timeout_s: float | None,
    fmt: Format,
    print_key: bool,
    separator: bytes,
    skip_damaged: bool = False,
) -> int:
    desc = await client.describe_topic(topic)
    n = len(desc.partitions)
    if partition is not None and partition >= n:
        raise UnknownPartitionError(f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
    partitions = [partition] if partition is not None else list(range(n))
    offsets: dict[int, int] = {}
    for p in partitions:
        if start.offset is not None:
            offsets[p] = start.offset
        else:
            offsets[p] = await client.list_offset(topic, p, start.timestamp)
    if start.offset is None and start.timestamp == LATEST:
        # The default start, as Kafka's console consumer: the end. Say so, on stderr, so a
        # person does not take the silence for a broken command.
        typer.echo(
            f"waiting for new messages on {topic} (use --from-beginning to read from the start)",
            err=True,
        )
    queue: asyncio.Queue[tuple[int, Record] | TidewireError] = asyncio.Queue(QUEUE_MAX)
    loop = asyncio.get_running_loop()
    tasks = [
        loop.create_task(
            _poll(client, topic, p, offsets[p], queue, skip_damaged), name=f"fetch {topic}/{p}"
        )
        for p in partitions
    ]
    out = typer.get_binary_stream("stdout")
    printed = 0
    try:
        while count is None or printed < count:
            if queue.empty():
                out.flush()  # whatever was printed is seen before waiting for more
                try:
                    async with asyncio.timeout(timeout_s):
                        item = await queue.get()
                except TimeoutError:
                    break  # --timeout seconds without a new message
            else:
                item = queue.get_nowait()
            if isinstance(item, TidewireError):
                raise item
            p, rec = item
            out.write(_line(topic, p, rec, fmt, print_key, separator))
            printed += 1
    finally:
        out.flush()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return printed


def _line(
    topic: str, partition: int, rec: Record, fmt: Format, print_key: bool, separator: bytes
) -> bytes:
    if fmt is Format.JSON:
        doc = record_doc(topic, partition, rec)
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    line = rec.value or b""
    if print_key:
        line = (rec.key or b"") + separator + line
    return line + b"\n"


def consume(
    topic: Annotated[
        str | None, typer.Argument(metavar="TOPIC", help="The topic.", show_default=False)
    ] = None,
    from_beginning: Annotated[
        bool,
        typer.Option("--from-beginning", help="Start at the oldest message.", show_default=False),
    ] = False,
    offset: Annotated[
        int | None,
        typer.Option(min=0, help="Start at this offset (needs --partition)."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Start at the first message at or after TIME: ISO-8601 "
            "(2024-05-01T12:00:00Z), ms since the epoch (1714564800000) or back from now "
            "(30s, 10m, 2h, 1d).",
            metavar="TIME",
        ),
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", "-p", min=0, help="Only this partition.")
    ] = None,
    count: Annotated[
        int | None,
        typer.Option("--count", "-n", min=1, help="Stop after this many messages."),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(min=0.001, help="Stop when this many seconds pass with no new message."),
    ] = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format", "-f", help="text: each value on a line; json: one object per line."
        ),
    ] = Format.TEXT,
    print_key: Annotated[
        bool,
        typer.Option("--print-key", help="Text format: print KEY SEP VALUE.", show_default=False),
    ] = False,
    key_separator: Annotated[
        str,
        typer.Option(
            help="Text format: what goes between key and value.  [default: a tab]",
            metavar="SEP",
            show_default=False,  # a tab would show as blank space
        ),
    ] = "\t",
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-g",
            help="Join this consumer group: read the partitions it assigns, from its committed "
            "offsets (new partitions: latest, or the oldest with --from-beginning), and commit "
            "what was printed.",
        ),
    ] = None,
    skip_damaged: Annotated[
        bool,
        typer.Option(
            "--skip-damaged",
            help="Read past damaged ranges of a partition's log (refused otherwise), "
            "reporting each gap on stderr; the messages in them are lost.",
            show_default=False,
        ),
    ] = False,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue",
            "-q",
            help="Take messages from this queue instead of a topic: each is printed, then "
            "acknowledged (or --nack, --reject).",
            show_default=False,
            rich_help_panel=_QUEUE_PANEL,
        ),
    ] = None,
    prefetch: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=MAX_PREFETCH,
            help=f"--queue: messages delivered and not yet settled, at most.  "
            f"[default: {DEFAULT_PREFETCH}]",
            show_default=False,
            rich_help_panel=_QUEUE_PANEL,
        ),
    ] = None,
    nack: Annotated[
        bool,
        typer.Option(
            "--nack",
            help="--queue: requeue each message after printing it instead of acking it (it "
            "is delivered again, first; bound the run with --count).",
            show_default=False,
            rich_help_panel=_QUEUE_PANEL,
        ),
    ] = False,
    reject: Annotated[
        bool,
        typer.Option(
            "--reject",
            help="--queue: reject each message after printing it: dead-lettered to the "
            "queue's dead-letter exchange (dropped without one).",
            show_default=False,
            rich_help_panel=_QUEUE_PANEL,
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="The same as --format json.", show_default=False),
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
) -> None:
    """Print a topic's messages: by default only new ones (it says so on stderr), from
    every partition; --from-beginning, --offset or --since start earlier. With --queue Q,
    take a queue's messages instead, acknowledging each once printed.

    Stops after --count messages, when --timeout seconds pass without one, or on Ctrl-C.
    """
    if as_json:
        fmt = Format.JSON
    if queue is not None:
        if topic is not None:
            fail("give a TOPIC or --queue, not both", EXIT_USAGE)
        if group is not None or from_beginning or offset is not None or since is not None:
            fail(
                "a queue hands out its messages itself: no --group, --from-beginning, "
                "--offset, --since with --queue",
                EXIT_USAGE,
            )
        if partition is not None or skip_damaged:
            fail("--partition and --skip-damaged are for topics, not --queue", EXIT_USAGE)
        if nack and reject:
            fail("give one of --nack, --reject", EXIT_USAGE)
        settle = Settle.NACK if nack else Settle.REJECT if reject else Settle.ACK

        async def queue_body(client: AsyncClient) -> int:
            return await consume_queue(
                client,
                addr,
                queue,
                prefetch=DEFAULT_PREFETCH if prefetch is None else prefetch,
                count=count,
                timeout_s=timeout,
                settle=settle,
                as_json=fmt is Format.JSON,
                print_key=print_key,
                separator=key_separator.encode(),
            )

        run_client(addr, queue_body)
        return
    if nack or reject or prefetch is not None:
        fail("--prefetch, --nack and --reject are for queues: they need --queue", EXIT_USAGE)
    if topic is None:
        fail("give a TOPIC (or --queue Q)", EXIT_USAGE)
    if group is not None:
        if offset is not None or since is not None or partition is not None:
            fail(
                "--group reads from the group's offsets: no --offset, --since, --partition",
                EXIT_USAGE,
            )
        _consume_group(
            addr,
            topic,
            group,
            from_beginning,
            count,
            timeout,
            fmt,
            print_key,
            key_separator,
            skip_damaged,
        )
        return
    if from_beginning + (offset is not None) + (since is not None) > 1:
        fail("give at most one of --from-beginning, --offset, --since", EXIT_USAGE)
    if offset is not None and partition is None:
        fail("--offset needs --partition: offsets belong to one partition", EXIT_USAGE)
    start = _Start()
    if from_beginning:
        start = _Start(timestamp=EARLIEST)
    elif offset is not None:
        start = _Start(offset=offset)
    elif since is not None:
        try:
            start = _Start(timestamp=parse_since(since, time.time_ns() // 1_000_000))
        except ValueError as exc:
            fail(str(exc), EXIT_USAGE)

    async def body(client: AsyncClient) -> int:
        return await _consume(
            client,
            topic,
            partition,
            start,
            count,
            timeout,
            fmt,
            print_key,
            key_separator.encode(),
            skip_damaged,
        )

    run_client(addr, body)


def _consume_group(
    addr: str,
    topic: str,
    group: str,
    from_beginning: bool,
    count: int | None,
    timeout_s: float | None,
    fmt: Format,
    print_key: bool,
    separator: str,
    skip_damaged: bool = False,
) -> None:
    """``consume --group``: print as a member of ``group``; the consumer commits the
    position after the last message printed when it closes (and every 5 s). With
    ``skip_damaged`` a damaged range is read past, each gap reported on stderr."""

    async def body(client: AsyncClient) -> int:
        out = typer.get_binary_stream("stdout")
        printed = 0
        reset = "earliest" if from_beginning else "latest"
        async with AsyncGroupConsumer(
            addr,
            group,
            topics=[topic],
            auto_offset_reset=reset,
            client_id="tidewire-cli",
            skip_damaged=skip_damaged,
            on_gap=_report_gap,
            tls=cli_tls(),
            credentials=cli_credentials(),
        ) as consumer:
            while count is None or printed < count:
                want = 500 if count is None else min(count - printed, 500)
                records = await consumer.poll(timeout_s, max_records=want)
                if not records:
                    break  # --timeout seconds without a new message
                for r in records:
                    rec = Record(r.offset, r.timestamp, r.key, r.value, r.headers)
                    out.write(_line(topic, r.partition, rec, fmt, print_key, separator.encode()))
                printed += len(records)
                out.flush()
        return printed

    run_client(addr, body)
