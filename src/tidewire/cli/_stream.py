"""``tidewire stream send | receive | read | list | describe``: lightweight streams over the
binary client (docs/streams.md).

Human output prints message values one per line (UTF-8; other bytes replaced), with
``[stream]`` before each when several streams are named; the next resume token of a read goes
to stderr, so stdout stays the messages. ``--json`` prints one JSON document (a message's
value as ``value`` when it is UTF-8 text, else ``value_base64``); ``read --follow --json``
prints one document per message (JSON lines).
"""

from __future__ import annotations

import base64
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tidewire.client import AsyncClient, SendItem, SendResult, StreamMessage
from tidewire.client._streams import DUPLICATE, FROM_END, FROM_START
from tidewire.errors import InvalidStreamError

from ._common import DEFAULT_ADDR, EXIT_USAGE, AddrOption, JsonOption, echo_json, fail, run_client
from ._queues import plain

__all__ = ["message_doc", "stream_app"]

stream_app = typer.Typer(
    name="stream",
    help="Lightweight streams: send, receive (work queue), read by token (fan-out), list, "
    "describe.",
)

StreamArg = Annotated[str, typer.Argument(help="The stream id.", show_default=False)]
StreamsArg = Annotated[
    list[str], typer.Argument(help="The stream ids (one request waits on all).", show_default=False)
]
WaitOption = Annotated[
    int,
    typer.Option(
        "--wait-ms",
        "--wait",
        help="Wait up to this long (ms) for a message when there is none (long-poll).",
    ),
]


def message_doc(m: StreamMessage) -> dict[str, Any]:
    """The JSON object of one received message (``value`` as text when it is UTF-8, else
    ``value_base64``)."""
    doc: dict[str, Any] = {"stream": m.stream}
    try:
        doc["value"] = m.value.decode("utf-8")
    except UnicodeDecodeError:
        doc["value_base64"] = base64.b64encode(m.value).decode("ascii")
    doc.update(
        uuid=m.uuid, timestamp_ms=m.timestamp_ms, expires_at_ms=m.expires_at_ms, token=m.token
    )
    return doc


def _line(m: StreamMessage, prefix: bool) -> str:
    text = m.value.decode("utf-8", errors="replace")
    return f"[{m.stream}] {text}" if prefix else text


def _result_doc(stream: str, r: SendResult) -> dict[str, Any]:
    outcome = "stored" if r.code == 0 else "duplicate" if r.code == DUPLICATE else "failed"
    return {"stream": stream, "outcome": outcome, **plain(r)}


@stream_app.command("send")
def stream_send(
    stream: StreamArg,
    value: Annotated[
        str | None,
        typer.Argument(
            help="The message; without it, each line of stdin is one message.",
            show_default=False,
        ),
    ] = None,
    uuid: Annotated[
        str,
        typer.Option("--uuid", help="Deduplicate: a uuid the stream saw recently stores nothing."),
    ] = "",
    ttl_ms: Annotated[
        int,
        typer.Option("--ttl-ms", help="Expire this long after it is stored (0: the default)."),
    ] = 0,
    persistent: Annotated[
        bool,
        typer.Option(
            "--persistent/--in-memory",
            help="Written durably and readable by token, or kept in memory only.",
        ),
    ] = False,
    ring_size: Annotated[
        int | None,
        typer.Option(
            "--ring-size",
            help="Waiting messages a stream this send creates keeps at most (default: the "
            "broker's stream_ring_size).",
            show_default=False,
        ),
    ] = None,
    block_ms: Annotated[
        int,
        typer.Option(
            "--block-ms", help="With the ring full, wait this long for room (0: drop the oldest)."
        ),
    ] = 0,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Send a message (or one per line of stdin) to a stream."""
    if ttl_ms < 0 or block_ms < 0 or (ring_size is not None and ring_size < 0):
        fail("--ttl-ms, --block-ms and --ring-size must be >= 0", EXIT_USAGE)
    if value is not None:
        # the argument's bytes as given (bytes that are not UTF-8 come surrogate-escaped)
        values = [value.encode("utf-8", "surrogateescape")]
    else:
        values = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    if uuid and len(values) > 1:
        fail(f"--uuid names one message, and stdin holds {len(values):,}", EXIT_USAGE)
    items = [SendItem(stream, v, uuid, ttl_ms, persistent) for v in values]

    async def body(client: AsyncClient) -> list[SendResult]:
        return await client.streams.send_many(items, ring_size=ring_size, block_ms=block_ms)

    results = run_client(addr, body, request_timeout_s=30.0 + block_ms / 1000)
    failed = [r for r in results if r.code > 0]
    if as_json:
        docs = [_result_doc(stream, r) for r in results]
        echo_json(docs[0] if value is not None else {"results": docs})
    else:
        stored = sum(r.code == 0 for r in results)
        dups = sum(r.code == DUPLICATE for r in results)
        what = "message" if len(results) == 1 else "messages"
        line = f"sent {stored:,} {what} to {stream!r}"
        if dups:
            line += f" ({dups:,} duplicate{'s' if dups > 1 else ''}: not stored)"
        if value is not None and results and results[0].token:
            line += f"; token {results[0].token}"
        typer.echo(line)
    if failed:
        fail(f"{len(failed):,} not stored: {failed[0].message}")


@stream_app.command("receive")
def stream_receive(
    streams: StreamsArg,
    wait_ms: WaitOption = 0,
    max_messages: Annotated[
        int, typer.Option("--max", help="Take at most this many messages in all.")
    ] = 1,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Take the oldest waiting message(s) of the stream(s): each is taken by one receiver
    only (work-queue mode). Exits 0 with no output when none came within --wait-ms."""
    if max_messages < 1 or wait_ms < 0:
        fail("--max must be >= 1 and --wait-ms >= 0", EXIT_USAGE)

    async def body(client: AsyncClient) -> list[StreamMessage]:
        return await client.streams.receive_many(
            streams, max_messages=max_messages, wait_ms=wait_ms
        )

    got = run_client(addr, body, request_timeout_s=30.0 + wait_ms / 1000)
    if as_json:
        echo_json({"messages": [message_doc(m) for m in got]})
        return
    for m in got:
        typer.echo(_line(m, len(streams) > 1))


@stream_app.command("read")
def stream_read(
    stream: StreamArg,
    token: Annotated[
        str,
        typer.Option(
            "--from",
            help="Resume token to read from (default: the oldest retained; '$': only what "
            "is sent from now on).",
            show_default=False,
        ),
    ] = FROM_START,
    wait_ms: WaitOption = 0,
    max_messages: Annotated[
        int, typer.Option("--max", help="Read at most this many messages (per request).")
    ] = 100,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep reading as messages come (long-polls of --wait-ms, 30 s by default), "
            "until Ctrl-C or --count.",
            show_default=False,
        ),
    ] = False,
    count: Annotated[
        int,
        typer.Option("--count", help="With --follow: stop after this many messages (0: never)."),
    ] = 0,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Read a stream's persistent messages from a resume token, without taking them
    (fan-out mode). The token to continue from is printed on stderr (in the JSON with
    --json)."""
    if max_messages < 1 or wait_ms < 0 or count < 0:
        fail("--max must be >= 1, --wait-ms and --count >= 0", EXIT_USAGE)
    if count and not follow:
        fail("--count goes with --follow", EXIT_USAGE)
    if token not in (FROM_START, FROM_END) and not token.isascii():
        fail(f"--from {token!r} is not a resume token", EXIT_USAGE)

    if follow:
        poll = wait_ms or 30_000

        async def follow_body(client: AsyncClient) -> None:
            seen = 0
            async for m in client.streams.subscribe(
                stream, token, wait_ms=poll, max_messages=max_messages
            ):
                if as_json:
                    echo_json(message_doc(m))
                else:
                    typer.echo(_line(m, False))
                sys.stdout.flush()
                seen += 1
                if count and seen >= count:
                    return

        run_client(addr, follow_body, request_timeout_s=30.0 + poll / 1000)
        return

    async def body(client: AsyncClient) -> tuple[list[StreamMessage], dict[str, str]]:
        return await client.streams.read(
            {stream: token}, max_messages=max_messages, wait_ms=wait_ms
        )

    got, tokens = run_client(addr, body, request_timeout_s=30.0 + wait_ms / 1000)
    following = tokens.get(stream, token)
    if as_json:
        echo_json({"messages": [message_doc(m) for m in got], "token": following})
        return
    for m in got:
        typer.echo(_line(m, False))
    typer.echo(f"token: {following}", err=True)


@stream_app.command("list")
def stream_list(
    prefix: Annotated[
        str,
        typer.Option(
            "--prefix", help="Only streams whose ids start with this.", show_default=False
        ),
    ] = "",
    limit: Annotated[int, typer.Option("--limit", help="List at most this many.")] = 1000,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """List the streams (sorted by id) with their message and receiver counts."""
    if limit < 1:
        fail(f"--limit={limit} must be >= 1", EXIT_USAGE)

    async def body(client: AsyncClient) -> list[Any]:
        return list(await client.streams.list(prefix, limit=limit))

    infos = run_client(addr, body)
    if as_json:
        echo_json({"streams": [plain(i) for i in infos]})
        return
    console = Console(highlight=False, soft_wrap=True)
    table = Table("stream", "waiting", "persistent", "in memory", "receivers", "ring size")
    for i in infos:
        table.add_row(
            i.stream,
            f"{i.waiting:,}",
            f"{i.persistent:,}",
            f"{i.in_memory:,}",
            f"{i.receivers:,}",
            f"{i.ring_size:,}",
        )
    console.print(table)
    console.print(f"{len(infos):,} stream{'' if len(infos) == 1 else 's'}")


@stream_app.command("describe")
def stream_describe(
    stream: Annotated[
        str | None,
        typer.Argument(
            help="The stream id; without it, the counts over every stream.", show_default=False
        ),
    ] = None,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Describe a stream (exit 1 when it does not exist), or without one the counts over
    every stream."""

    async def body(client: AsyncClient) -> Any:
        if stream is None:
            return await client.streams.stats()
        info = await client.streams.describe(stream)
        if info is None:
            raise InvalidStreamError(
                f"stream {stream!r} does not exist (never sent to, or forgotten when empty "
                "and idle)"
            )
        return info

    doc: dict[str, Any] = plain(run_client(addr, body))
    if as_json:
        echo_json(doc)
        return
    width = max(len(k) for k in doc)
    for k, v in doc.items():
        counted = isinstance(v, int) and not isinstance(v, bool) and not k.endswith("_ms")
        shown = f"{v:,}" if counted else str(v)
        typer.echo(f"{k.replace('_', ' '):<{width}}  {shown}")
