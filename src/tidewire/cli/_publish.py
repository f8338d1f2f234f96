"""``tidewire publish``: one message from the command line, or one message per line of stdin.

Routing (without ``--partition``): a keyed message goes to ``fnv1a_32(key) % partitions``
(:mod:`tidewire.client.partitioner`), an unkeyed one to the next partition in turn, starting
from a random one so that many short runs spread over the partitions.

Lines from stdin are grouped: messages wait in per-partition lists until the group holds
:data:`GROUP_MAX_BYTES` or :data:`GROUP_MAX_MESSAGES`, or its first message has waited
:data:`LINGER_S` (so a slow pipe such as ``tail -f`` still publishes promptly); then every
partition's list goes as one batch, the partitions' requests concurrently. Reading happens
outside the event loop, so Ctrl-C interrupts a read at once.

With ``--exchange X`` the messages go through exchange ``X`` (``amq.default``: the default
one) with ``--routing-key`` instead, into the queues (and topics) its bindings route them to;
each request returns once the broker confirmed it (durable queues: fsynced). Lines from stdin
are grouped the same way, at most :data:`EXCHANGE_GROUP_MAX_MESSAGES` a request.
"""

from __future__ import annotations

import asyncio
import os
import random
import select
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, BinaryIO

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn

from tidewire.client import AsyncClient, Message
from tidewire.client.partitioner import partition_for_key
from tidewire.errors import TidewireError

from ._common import (
    DEFAULT_ADDR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    AddrOption,
    JsonOption,
    check_addr,
    cli_credentials,
    cli_tls,
    echo_json,
    fail,
)
from ._queues import to_exchange

__all__ = ["GROUP_MAX_BYTES", "GROUP_MAX_MESSAGES", "LINGER_S", "publish"]

#: The --help panel of the options that apply to --exchange.
_EXCHANGE_PANEL = "Exchanges (--exchange)"

#: A group of stdin lines is sent once it holds this much data: large enough that a big file
#: costs few round trips, far below the default max_batch_bytes (16 MiB) and frame limit.
GROUP_MAX_BYTES = 512 * 1024
#: ... or this many messages, so a flood of tiny lines is sent in steady steps too.
GROUP_MAX_MESSAGES = 5000
#: ... or once its first line has waited this long (seconds), for slow producers upstream.
LINGER_S = 0.1
#: What a record costs in a batch besides its key, value and headers (varints and
#: attributes), rounded up: used only to size groups.
RECORD_OVERHEAD = 24
#: Bytes read from stdin at a time.
READ_CHUNK = 256 * 1024
#: The largest line accepted when the topic's own limit is not known yet (bytes).
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class _Landing:
    """Where one partition's messages of this run went."""

    messages: int = 0
    first_offset: int = -1
    last_offset: int = -1


class _Publisher:
    """Routes messages to partitions, groups them, sends each group's partitions at once."""

    def __init__(self, client: AsyncClient, topic: str, partition: int | None) -> None:
        self.client = client
        self.topic = topic
        self.partition = partition
        self.count: int | None = None  # partitions; None: the topic does not exist yet
        self.max_message_bytes = DEFAULT_MAX_LINE_BYTES
        self.group_bytes_limit = GROUP_MAX_BYTES
        self.next_partition = 0
        self.pending: dict[int, list[Message]] = {}
        self.pending_bytes = 0
        self.pending_messages = 0
        self.pending_since = 0.0  # monotonic time the group's first message was added
        self.landed: dict[int, _Landing] = {}

    @property
    def published(self) -> int:
        return sum(x.messages for x in self.landed.values())

    async def start(self) -> None:
        """Learn the partition count and the largest batch the topic accepts."""
        # Created here as a first publish would, if the broker does that: a keyed message's
        # partition depends on the partition count.
        desc = await self.client.describe_topic(self.topic, auto_create=True)
        self._learn(len(desc.partitions), desc.config.max_message_bytes)
        self.next_partition = random.randrange(len(desc.partitions))

    def _learn(self, count: int, max_message_bytes: int | None) -> None:
        self.count = count
        if max_message_bytes:
            self.max_message_bytes = max_message_bytes
            # Half the limit: the size estimate of a group is close but not exact.
            self.group_bytes_limit = min(GROUP_MAX_BYTES, max(1, max_message_bytes // 2))

    def add(self, message: Message) -> bool:
        """Queue one message (see :attr:`routable`); return whether the group is full and
        must be sent (:meth:`flush`)."""
        p = self._route(message)
        if not self.pending_messages:
            self.pending_since = time.monotonic()
        self.pending.setdefault(p, []).append(message)
        self.pending_messages += 1
        self.pending_bytes += _size(message)
        return (
            self.pending_bytes >= self.group_bytes_limit
            or self.pending_messages >= GROUP_MAX_MESSAGES
        )

    def _route(self, message: Message) -> int:
        if self.partition is not None:
            return self.partition
        assert self.count is not None
        if message.key is not None:
            return partition_for_key(message.key, self.count)
        p = self.next_partition
        self.next_partition = (p + 1) % self.count
        return p

    def overdue(self) -> float | None:
        """Seconds until the pending group must be sent (None: nothing pending)."""
        if not self.pending_messages:
            return None
        return max(0.0, self.pending_since + LINGER_S - time.monotonic())

    async def flush(self) -> None:
        """Send every pending message: one request per partition, all at once."""
        pending, self.pending = self.pending, {}
        self.pending_bytes = self.pending_messages = 0
        if not pending:
            return
        tasks = [
            asyncio.get_running_loop().create_task(self._send(p, msgs))
            for p, msgs in pending.items()
        ]
        await asyncio.wait(tasks)
        for task in tasks:
            task.result()  # the first failure, after every request has its answer

    async def _send(self, partition: int, messages: list[Message]) -> None:
        base = await self.client.produce(self.topic, partition, messages)
        landing = self.landed.setdefault(partition, _Landing())
        if landing.first_offset < 0:
            landing.first_offset = base
        landing.messages += len(messages)
        landing.last_offset = max(landing.last_offset, base + len(messages) - 1)


#: Messages of one request through an exchange, at most (the client coalesces up to 1,000
#: messages / 1 MiB into one request; a group of stdin lines is sent as one such request).
EXCHANGE_GROUP_MAX_MESSAGES = 1000


class _ExchangePublisher:
    """Publishes through an exchange (``publish --exchange``): every message with the same
    routing key, headers and flags; stdin lines grouped like :class:`_Publisher`'s, each
    group one confirmed request."""

    def __init__(
        self,
        client: AsyncClient,
        exchange: str,
        routing_key: str,
        headers: dict[str, str],
        *,
        mandatory: bool,
        ttl_ms: int,
        delay_ms: int,
    ) -> None:
        self.client = client
        self.exchange = exchange
        self.routing_key = routing_key
        self.headers = headers
        self.mandatory = mandatory
        self.ttl_ms = ttl_ms
        self.delay_ms = delay_ms
        self.max_message_bytes = DEFAULT_MAX_LINE_BYTES
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.pending_since = 0.0
        self.published = 0
        self.unroutable = 0  # messages that went nowhere (not --mandatory: dropped)
        self.queues: set[str] = set()
        self.topics: list[tuple[str, int, int]] = []

    async def start(self) -> None:
        """Nothing to learn first: the broker routes."""

    def add(self, message: Message) -> bool:
        """Queue one message's value; return whether the group is full."""
        if not self.pending:
            self.pending_since = time.monotonic()
        value = message.value or b""
        self.pending.append(value)
        self.pending_bytes += RECORD_OVERHEAD + len(value)
        return (
            self.pending_bytes >= GROUP_MAX_BYTES
            or len(self.pending) >= EXCHANGE_GROUP_MAX_MESSAGES
        )

    def overdue(self) -> float | None:
        """Seconds until the pending group must be sent (None: nothing pending)."""
        if not self.pending:
            return None
        return max(0.0, self.pending_since + LINGER_S - time.monotonic())

    async def flush(self) -> None:
        """Publish the pending messages as one request; returns once the broker confirmed
        them (stored in every queue they were routed to; durable queues: fsynced)."""
        values, self.pending = self.pending, []
        self.pending_bytes = 0
        if not values:
            return
        result = await self.client.publish_batch(
            self.exchange,
            self.routing_key,
            values,
            headers=self.headers or None,
            mandatory=self.mandatory,
            ttl_ms=self.ttl_ms,
            delay_ms=self.delay_ms,
        )
        self.published += len(values)
        if result.unroutable:
            self.unroutable += len(values)
        self.queues.update(result.queues)
        self.topics.extend((t, p, o) for t, p, o in result.topics)


_Sink = _Publisher | _ExchangePublisher


def _size(m: Message) -> int:
    return (
        RECORD_OVERHEAD
        + len(m.value or b"")
        + len(m.key or b"")
        + sum(len(k) + len(v or b"") + 2 for k, v in m.headers)
    )


def publish(
    topic: Annotated[
        str | None, typer.Argument(metavar="TOPIC", help="The topic.", show_default=False)
    ] = None,
    message: Annotated[
        str | None,
        typer.Argument(
            help="The message; '-' reads one message per line from stdin.", show_default=False
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", "-k", help="The message's key (UTF-8); routes it by hash."),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header",
            "-H",
            help="A header KEY=VALUE (repeatable), on every message.",
            metavar="KEY=VALUE",
        ),
    ] = None,
    partition: Annotated[
        int | None,
        typer.Option("--partition", "-p", min=0, help="Send to this partition (no routing)."),
    ] = None,
    key_separator: Annotated[
        str | None,
        typer.Option(
            help="With '-': split each line at the first SEP into key and value.",
            metavar="SEP",
        ),
    ] = None,
    topic_opt: Annotated[
        str | None,
        typer.Option("--topic", help="The topic; then the one argument is the MESSAGE."),
    ] = None,
    payload: Annotated[
        str | None, typer.Option("--payload", help="The message (another way to give MESSAGE).")
    ] = None,
    exchange: Annotated[
        str | None,
        typer.Option(
            "--exchange",
            "-e",
            help="Publish through this exchange into queues (amq.default: to the queue the "
            "routing key names); then the one argument is the MESSAGE. Confirmed once "
            "stored in every queue it was routed to.",
            show_default=False,
            rich_help_panel=_EXCHANGE_PANEL,
        ),
    ] = None,
    routing_key: Annotated[
        str,
        typer.Option(
            "--routing-key",
            "-r",
            help="--exchange: the routing key the exchange's bindings match.",
            rich_help_panel=_EXCHANGE_PANEL,
        ),
    ] = "",
    mandatory: Annotated[
        bool,
        typer.Option(
            "--mandatory",
            help="--exchange: fail if no binding routes the message (else it is dropped).",
            show_default=False,
            rich_help_panel=_EXCHANGE_PANEL,
        ),
    ] = False,
    ttl_ms: Annotated[
        int,
        typer.Option(
            "--ttl-ms",
            min=0,
            help="--exchange: expire the message after this long in a queue (ms; 0: the "
            "queue's message_ttl_ms only).",
            rich_help_panel=_EXCHANGE_PANEL,
        ),
    ] = 0,
    delay_ms: Annotated[
        int,
        typer.Option(
            "--delay-ms",
            min=0,
            help="--exchange: deliver the message only after this long (ms).",
            rich_help_panel=_EXCHANGE_PANEL,
        ),
    ] = 0,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Publish a message, or with '-' one message per line of stdin (grouped into batches).

    Prints the partition and offset where the messages landed. With --exchange X the
    message goes through an exchange into queues instead of into a topic.
    """
    check_addr(addr)
    if exchange is not None:
        if topic_opt is not None:
            fail("give --exchange or --topic, not both", EXIT_USAGE)
        if message is not None:
            fail(
                "with --exchange give only the MESSAGE (the routing key is --routing-key)",
                EXIT_USAGE,
            )
        if key is not None or key_separator is not None:
            fail(
                "--key and --key-separator are a topic message's key: with --exchange, "
                "give --routing-key",
                EXIT_USAGE,
            )
        if partition is not None:
            fail("--partition is for topics: an exchange routes by --routing-key", EXIT_USAGE)
        message = topic
        topic = None
    elif mandatory or ttl_ms or delay_ms or routing_key:
        fail("--routing-key, --mandatory, --ttl-ms and --delay-ms need --exchange", EXIT_USAGE)
    if topic_opt is not None:  # brokectl's spelling: publish --topic T [--payload P | P]
        if message is not None:
            fail("give the topic once: TOPIC or --topic", EXIT_USAGE)
        topic, message = topic_opt, topic
    if payload is not None:
        if message is not None:
            fail("give the message once: MESSAGE or --payload", EXIT_USAGE)
        message = payload
    if topic is None and exchange is None:
        fail("give a TOPIC (or --topic, or --exchange)", EXIT_USAGE)
    if message is None:
        fail("give a MESSAGE, or '-' to read one message per line from stdin", EXIT_USAGE)
    from_stdin = message == "-"
    if key_separator is not None and not from_stdin:
        fail("--key-separator applies to lines from stdin (MESSAGE '-')", EXIT_USAGE)
    if key_separator == "":
        fail("--key-separator must not be empty", EXIT_USAGE)
    if key is not None and key_separator is not None:
        fail("give --key or --key-separator, not both", EXIT_USAGE)
    headers = _parse_headers(header or [])
    key_bytes = None if key is None else key.encode()
    sep = None if key_separator is None else key_separator.encode()

    progress: Progress | None = None
    with asyncio.Runner() as runner:
        client = AsyncClient(addr, tls=cli_tls(), credentials=cli_credentials())
        publisher: _Sink
        if exchange is not None:
            publisher = _ExchangePublisher(
                client,
                to_exchange(exchange),
                routing_key,
                {k: (v or b"").decode() for k, v in headers},
                mandatory=mandatory,
                ttl_ms=ttl_ms,
                delay_ms=delay_ms,
            )
        else:
            assert topic is not None
            publisher = _Publisher(client, topic, partition)
        try:
            runner.run(publisher.start())
            if from_stdin:
                stdin = sys.stdin.buffer
                if sys.stderr.isatty():
                    progress = Progress(
                        SpinnerColumn(),
                        TextColumn("{task.description}"),
                        console=Console(stderr=True),
                        transient=True,
                    )
                    progress.start()
                _publish_lines(runner, publisher, stdin, key_bytes, sep, headers, progress)
            else:
                _publish_one(runner, publisher, Message(message.encode(), key_bytes, headers))
                runner.run(publisher.flush())
        except (TidewireError, _LineError) as exc:
            _stop(progress)
            done = publisher.published
            note = f" ({done:,} message(s) were published before)" if from_stdin and done else ""
            fail(f"{exc}{note}")
        except KeyboardInterrupt:
            _stop(progress)
            typer.echo(f"interrupted: {publisher.published:,} message(s) published", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        finally:
            runner.run(client.close())
    _stop(progress)
    if isinstance(publisher, _ExchangePublisher):
        _report_exchange(publisher, exchange or "", from_stdin=from_stdin, as_json=as_json)
    else:
        _report(publisher, from_stdin=from_stdin, as_json=as_json)


def _stop(progress: Progress | None) -> None:
    if progress is not None:
        progress.stop()


def _parse_headers(items: list[str]) -> list[tuple[str, bytes | None]]:
    headers: list[tuple[str, bytes | None]] = []
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k:
            fail(f"--header {item!r} must be KEY=VALUE", EXIT_USAGE)
        headers.append((k, v.encode()))
    return headers


def _publish_one(runner: asyncio.Runner, publisher: _Sink, message: Message) -> None:
    if publisher.add(message):
        runner.run(publisher.flush())


def _publish_lines(
    runner: asyncio.Runner,
    publisher: _Sink,
    stream: BinaryIO,
    key: bytes | None,
    sep: bytes | None,
    headers: list[tuple[str, bytes | None]],
    progress: Progress | None,
) -> None:
    task = None if progress is None else progress.add_task("publishing", total=None)
    lineno = 0
    for line in _lines(stream, publisher):
        if line is None:  # nothing more to read for now: send what waits
            runner.run(publisher.flush())
        else:
            lineno += 1
            if sep is None:
                msg = Message(line, key, headers)
            else:
                k, found, v = line.partition(sep)
                if not found:
                    runner.run(publisher.flush())
                    raise _LineError(
                        f"stdin line {lineno}: no key separator {sep.decode()!r} in it"
                    )
                msg = Message(v, k, headers)
            _publish_one(runner, publisher, msg)
        if progress is not None and task is not None and lineno % 1000 == 0:
            progress.update(task, description=f"{publisher.published:,} messages published")
    runner.run(publisher.flush())


class _LineError(Exception):
    """A line of stdin that cannot be published."""


def _lines(stream: BinaryIO, publisher: _Sink) -> Iterator[bytes | None]:
    """The lines of ``stream`` without their line ending (``\\n`` or ``\\r\\n``); ``None``
    when the pending group is due and no more input is ready."""
    try:
        fd: int | None = stream.fileno()
    except (OSError, ValueError):  # not a real file (tests): read it in chunks
        fd = None
    buf = b""
    while True:
        if fd is not None:
            wait = publisher.overdue()
            if wait is not None and not select.select([fd], [], [], wait)[0]:
                yield None
                continue
            chunk = os.read(fd, READ_CHUNK)
        else:
            chunk = stream.read(READ_CHUNK)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r")
        if len(buf) > publisher.max_message_bytes:
            raise _LineError(
                f"a line of stdin is longer than the topic's max_message_bytes="
                f"{publisher.max_message_bytes:,}"
            )
    if buf:
        yield buf.removesuffix(b"\r")


def _report(publisher: _Publisher, *, from_stdin: bool, as_json: bool) -> None:
    landed = sorted(publisher.landed.items())
    if not from_stdin:
        ((p, landing),) = landed
        if as_json:
            echo_json({"topic": publisher.topic, "partition": p, "offset": landing.first_offset})
        else:
            typer.echo(
                f"published to {publisher.topic} partition {p} at offset {landing.first_offset}"
            )
        return
    if as_json:
        echo_json(
            {
                "topic": publisher.topic,
                "messages": publisher.published,
                "partitions": [
                    {
                        "partition": p,
                        "messages": x.messages,
                        "first_offset": x.first_offset,
                        "last_offset": x.last_offset,
                    }
                    for p, x in landed
                ],
            }
        )
        return
    typer.echo(f"published {publisher.published:,} message(s) to {publisher.topic}")
    for p, x in landed:
        typer.echo(
            f"  partition {p}: {x.messages:,} message(s), offsets {x.first_offset}..{x.last_offset}"
        )


def _report_exchange(
    publisher: _ExchangePublisher, exchange: str, *, from_stdin: bool, as_json: bool
) -> None:
    queues = sorted(publisher.queues)
    if as_json:
        doc: dict[str, object] = {"exchange": exchange, "routing_key": publisher.routing_key}
        if from_stdin:
            doc["messages"] = publisher.published
        doc["queues"] = queues
        doc["topics"] = [{"topic": t, "partition": p, "offset": o} for t, p, o in publisher.topics]
        doc["unroutable"] = publisher.unroutable if from_stdin else publisher.unroutable > 0
        echo_json(doc)
        return
    what = f"{publisher.published:,} message(s)" if from_stdin else "published"
    where = [f"queue {q}" for q in queues] + [
        f"topic {t} partition {p} at offset {o}" for t, p, o in publisher.topics
    ]
    head = f"{what} to exchange {exchange} with routing key {publisher.routing_key!r}"
    if from_stdin:
        head = f"published {head}"
    if where:
        typer.echo(f"{head}: {', '.join(where)}")
    if publisher.unroutable:
        n = f"{publisher.unroutable:,} message(s)" if from_stdin else "the message"
        typer.echo(
            f"{head}: no binding routed {n}, dropped (--mandatory makes that an error)"
            if not where
            else f"no binding routed {n}, dropped (--mandatory makes that an error)"
        )
