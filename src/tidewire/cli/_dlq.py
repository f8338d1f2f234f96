"""``tidewire dlq``: the dead letters of a queue: list (browse, without taking them),
replay (move them back to the queue each came from) and purge.

A dead-letter queue is an ordinary queue bound to the exchange other queues name as their
dead-letter exchange. Each message in it carries an ``x-death`` header (a JSON list, newest
first) saying which queue it died in, why (``rejected``, ``expired``, ``maxlen``,
``delivery_limit``), how many times, its routing key and deliveries then, and when;
``replay`` republishes it to the queue the newest entry names.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tidewire.client import AsyncClient, QueueMessage

from ._common import (
    DEFAULT_ADDR,
    EXIT_USAGE,
    AddrOption,
    JsonOption,
    echo_json,
    fail,
    run_client,
)
from ._queue_messages import deaths, message_doc, text_or_base64

__all__ = ["dlq_app"]

dlq_app = typer.Typer(
    name="dlq", help="List, replay and purge the dead letters of a dead-letter queue."
)

QueueArg = Annotated[str, typer.Argument(help="The dead-letter queue.", show_default=False)]
#: The longest value ``dlq list`` prints in its table (characters); --json prints it whole.
VALUE_COLUMN = 60


def _death_doc(message: QueueMessage) -> dict[str, object]:
    doc = message_doc(message)
    for key in ("delivery_tag", "delivery_count", "redelivered"):
        doc.pop(key)  # browsing delivers nothing
    doc["x_death"] = deaths(message)
    return doc


@dlq_app.command("list")
def list_(
    queue: QueueArg,
    from_offset: Annotated[
        int, typer.Option("--from", min=0, help="Start at this offset of the queue.")
    ] = 0,
    max_messages: Annotated[
        int,
        typer.Option("--max", min=1, max=10_000, help="Show at most this many messages."),
    ] = 100,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Show the queue's ready messages (oldest first) with why each was dead-lettered,
    without taking them: nothing is delivered or changed."""

    async def body(client: AsyncClient) -> list[QueueMessage]:
        return list(await client.browse(queue, from_offset=from_offset, max_messages=max_messages))

    messages = run_client(addr, body)
    if as_json:
        echo_json([_death_doc(m) for m in messages])
        return
    if not messages:
        typer.echo(f"queue {queue!r}: no ready messages from offset {from_offset}")
        return
    console = Console(highlight=False, soft_wrap=True)
    table = Table("offset", "from queue", "reason", "count", "routing key", "value")
    for m in messages:
        newest: dict[str, Any] = (deaths(m) or [{}])[0]
        value, b64 = text_or_base64(m.value)
        shown = value or ""
        if len(shown) > VALUE_COLUMN:
            shown = shown[: VALUE_COLUMN - 3] + "..."
        table.add_row(
            str(m.offset),
            str(newest.get("queue", "")),
            str(newest.get("reason", "")),
            str(newest.get("count", "")),
            str(newest.get("routing_key", m.routing_key)),
            f"(base64) {shown}" if b64 else shown,
        )
    console.print(table)


@dlq_app.command("replay")
def replay(
    queue: QueueArg,
    offset: Annotated[
        list[int] | None,
        typer.Option("--offset", min=0, help="Replay the message at this offset (repeatable)."),
    ] = None,
    from_offset: Annotated[
        int | None,
        typer.Option("--from", min=0, help="Replay the ready messages from this offset on."),
    ] = None,
    to_offset: Annotated[
        int | None,
        typer.Option("--to", min=0, help="... up to this offset, exclusive (default: to the end)."),
    ] = None,
    all_: Annotated[
        bool,
        typer.Option("--all", help="Replay every ready message.", show_default=False),
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Move dead letters back to the queue each died in (its newest x-death entry), through
    the default exchange, headers kept: --offset N (repeatable), a range --from/--to, or
    --all."""
    ranged = from_offset is not None or to_offset is not None
    if (bool(offset) + ranged + all_) != 1:
        fail("say which messages: --offset N (repeatable), --from/--to, or --all", EXIT_USAGE)
    if from_offset is not None and to_offset is not None and to_offset <= from_offset:
        fail(f"--to {to_offset} must be above --from {from_offset}", EXIT_USAGE)

    async def body(client: AsyncClient) -> int:
        if offset:
            return await client.replay(queue, offsets=offset)
        return await client.replay(queue, from_offset=from_offset or 0, to_offset=to_offset)

    moved = run_client(addr, body)
    if as_json:
        echo_json({"queue": queue, "replayed": moved})
    else:
        typer.echo(f"replayed {moved:,} message(s) from {queue!r}")


@dlq_app.command("purge")
def purge(queue: QueueArg, addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False) -> None:
    """Remove every ready message of the dead-letter queue."""

    async def body(client: AsyncClient) -> int:
        return await client.purge_queue(queue)

    purged = run_client(addr, body)
    if as_json:
        echo_json({"queue": queue, "purged": purged})
    else:
        typer.echo(f"purged {purged:,} dead letter(s) from {queue!r}")
