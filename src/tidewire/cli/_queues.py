"""``tidewire exchange``, ``tidewire queue``, ``tidewire bind`` and ``tidewire unbind``:
declare, delete, purge, list and describe exchanges and queues, and bind them.

The default exchange, whose name is ``""`` on the wire, is spelled ``amq.default`` here (as
in the HTTP paths); every queue is bound to it by its own name. ``--json`` prints one JSON
document: a queue as its settings, its message counts and its counters
(:func:`queue_doc`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from tidewire.client import AsyncClient
from tidewire.errors import UnknownExchangeError

from ._common import (
    DEFAULT_ADDR,
    EXIT_USAGE,
    AddrOption,
    JsonOption,
    echo_json,
    fail,
    run_client,
)

__all__ = [
    "DEFAULT_EXCHANGE_NAME",
    "bind",
    "display_exchange",
    "exchange_app",
    "parse_args",
    "plain",
    "queue_app",
    "queue_doc",
    "to_exchange",
    "unbind",
]

#: How the CLI spells the default exchange (``""`` on the wire).
DEFAULT_EXCHANGE_NAME = "amq.default"

exchange_app = typer.Typer(name="exchange", help="Declare, delete and list exchanges.")
queue_app = typer.Typer(name="queue", help="Declare, delete, purge, list and describe queues.")


class ExchangeType(enum.StrEnum):
    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"
    HEADERS = "headers"


class Overflow(enum.StrEnum):
    REJECT_PUBLISH = "reject-publish"
    DROP_HEAD = "drop-head"


def to_exchange(name: str) -> str:
    """The wire name of an exchange as the CLI spells it (``amq.default`` -> ``""``)."""
    return "" if name == DEFAULT_EXCHANGE_NAME else name


def display_exchange(name: str) -> str:
    """The CLI's spelling of an exchange's wire name (``""`` -> ``amq.default``)."""
    return name or DEFAULT_EXCHANGE_NAME


def parse_args(items: Sequence[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` items (of ``option``, named in the error) as a dict; a repeated key
    keeps its last value."""
    out: dict[str, str] = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k:
            fail(f"{option} {item!r} must be KEY=VALUE", EXIT_USAGE)
        out[k] = v
    return out


def plain(obj: object) -> Any:
    """A value of the client (msgspec Structs, dataclasses, lists, tuples, dicts) as
    JSON-ready builtins, every field included (the protocol's Structs leave out fields at
    their defaults when encoded; a user reading ``--json`` wants them all)."""
    if isinstance(obj, msgspec.Struct):
        return {k: plain(v) for k, v in msgspec.structs.asdict(obj).items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [plain(x) for x in obj]
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    return obj


def queue_doc(info: object) -> dict[str, Any]:
    """The JSON object of one queue: its settings, message counts and counters, with the
    dead-letter exchange in the CLI's spelling (``amq.default``; ``null``: none)."""
    doc: dict[str, Any] = dict(plain(info))
    dlx = doc.get("dead_letter_exchange")
    if dlx is not None:
        doc["dead_letter_exchange"] = display_exchange(dlx)
    return doc


def _exchange_doc(info: object) -> dict[str, Any]:
    doc: dict[str, Any] = dict(plain(info))
    doc["name"] = display_exchange(doc.get("name", ""))
    return doc


def _binding_doc(info: object) -> dict[str, Any]:
    doc: dict[str, Any] = dict(plain(info))
    doc["exchange"] = display_exchange(doc.get("exchange", ""))
    return doc


# --- exchanges -----------------------------------------------------------------------------

ExchangeArg = Annotated[
    str, typer.Argument(help="The exchange (amq.default: the default one).", show_default=False)
]


@exchange_app.command("declare")
def exchange_declare(
    name: ExchangeArg,
    type_: Annotated[
        ExchangeType,
        typer.Option(
            "--type",
            "-t",
            help="direct: routing key equal to the binding key; fanout: every binding; "
            "topic: binding keys as patterns with * (one word) and # (any words); "
            "headers: bindings' --arg pairs matched against the message's headers.",
        ),
    ] = ExchangeType.DIRECT,
    durable: Annotated[
        bool,
        typer.Option(
            "--durable/--transient", help="Kept across restarts, or gone when the broker stops."
        ),
    ] = True,
    alternate_exchange: Annotated[
        str | None,
        typer.Option(
            "--alternate-exchange",
            help="Where messages go that no binding of this exchange routes.",
            show_default=False,
        ),
    ] = None,
    passive: Annotated[
        bool,
        typer.Option("--passive", help="Only check that the exchange exists.", show_default=False),
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Declare an exchange: create it, or check that one of that name has these settings."""
    wire = to_exchange(name)
    if not wire:
        fail(f"{DEFAULT_EXCHANGE_NAME} is built in: it cannot be declared", EXIT_USAGE)

    async def body(client: AsyncClient) -> None:
        if passive:
            exchanges, _ = await client.list_exchanges()
            if not any(x.name == wire for x in exchanges):
                raise UnknownExchangeError(f"exchange {name!r} does not exist")
            return
        await client.declare_exchange(
            wire,
            str(type_),
            durable=durable,
            alternate_exchange=to_exchange(alternate_exchange or ""),
        )

    run_client(addr, body)
    if as_json:
        echo_json(
            {
                "name": name,
                "type": str(type_),
                "durable": durable,
                "alternate_exchange": alternate_exchange or "",
            }
            if not passive
            else {"name": name, "exists": True}
        )
    elif passive:
        typer.echo(f"exchange {name!r} exists")
    else:
        typer.echo(f"declared {type_} exchange {name!r}")


@exchange_app.command("delete")
def exchange_delete(
    name: ExchangeArg,
    if_unused: Annotated[
        bool,
        typer.Option(
            "--if-unused",
            help="Refuse if the exchange has bindings (nothing is deleted then).",
            show_default=False,
        ),
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
) -> None:
    """Delete an exchange and its bindings (the queues they lead to stay)."""
    wire = to_exchange(name)
    if not wire:
        fail(f"{DEFAULT_EXCHANGE_NAME} is built in: it cannot be deleted", EXIT_USAGE)

    async def body(client: AsyncClient) -> None:
        await client.delete_exchange(wire, if_unused=if_unused)

    run_client(addr, body)
    typer.echo(f"deleted exchange {name!r}")


@exchange_app.command("list")
def exchange_list(addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False) -> None:
    """List the exchanges (amq.default included) and their bindings."""

    async def body(client: AsyncClient) -> tuple[list[Any], list[Any]]:
        exchanges, bindings = await client.list_exchanges()
        return list(exchanges), list(bindings)

    exchanges, bindings = run_client(addr, body)
    ex_docs = sorted((_exchange_doc(x) for x in exchanges), key=lambda d: d["name"])
    b_docs = [_binding_doc(b) for b in bindings]
    if as_json:
        echo_json({"exchanges": ex_docs, "bindings": b_docs})
        return
    console = Console(highlight=False, soft_wrap=True)
    table = Table("exchange", "type", "durable", "alternate exchange")
    for d in ex_docs:
        table.add_row(
            d["name"],
            str(d.get("type", "")),
            "yes" if d.get("durable", True) else "no",
            d.get("alternate_exchange") or "",
        )
    console.print(table)
    if b_docs:
        bt = Table("exchange", "destination", "key", "arguments")
        for d in b_docs:
            kind = d.get("destination_kind", "queue")
            args = d.get("arguments") or {}
            bt.add_row(
                d["exchange"],
                f"{kind} {d.get('destination', '')}",
                d.get("key", ""),
                " ".join(f"{k}={v}" for k, v in _pairs(args)),
            )
        console.print(bt)


def _pairs(args: Mapping[str, str] | Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    if isinstance(args, Mapping):
        return sorted(args.items())
    return [(str(p[0]), str(p[1])) for p in args]


# --- queues --------------------------------------------------------------------------------

QueueArg = Annotated[str, typer.Argument(help="The queue.", show_default=False)]


@queue_app.command("declare")
def queue_declare(
    name: QueueArg,
    durable: Annotated[
        bool,
        typer.Option(
            "--durable/--transient",
            help="Messages in a log (kept across restarts and crashes; a publish is confirmed "
            "after fsync), or in memory only.",
        ),
    ] = True,
    exclusive: Annotated[
        bool,
        typer.Option(
            "--exclusive",
            help="(transient) usable only from this command's connection, deleted when it "
            "closes: with the CLI, when this command exits.",
            show_default=False,
        ),
    ] = False,
    auto_delete: Annotated[
        bool,
        typer.Option(
            "--auto-delete",
            help="Deleted when its last consumer leaves (after having had one).",
            show_default=False,
        ),
    ] = False,
    max_deliveries: Annotated[
        int,
        typer.Option(
            min=0,
            help="Deliveries after which a message is dead-lettered (delivery_limit) instead "
            "of redelivered (0: no limit).",
        ),
    ] = 0,
    message_ttl_ms: Annotated[
        int,
        typer.Option(
            "--message-ttl-ms",
            min=0,
            help="Messages older than this are never delivered but dead-lettered (expired) "
            "(ms; 0: no limit).",
        ),
    ] = 0,
    max_length: Annotated[
        int, typer.Option(min=0, help="Messages waiting (ready and delayed) at most (0: no limit).")
    ] = 0,
    max_length_bytes: Annotated[
        int, typer.Option(min=0, help="Bytes of unsettled messages at most (0: no limit).")
    ] = 0,
    overflow: Annotated[
        Overflow,
        typer.Option(
            help="At a length limit: reject-publish refuses the publish, drop-head "
            "dead-letters the oldest message (maxlen)."
        ),
    ] = Overflow.REJECT_PUBLISH,
    dead_letter_exchange: Annotated[
        str | None,
        typer.Option(
            "--dead-letter-exchange",
            help="Where rejected, expired, over-limit and dropped messages go (amq.default: "
            "to the queue their routing key names). Without it they are dropped.",
            show_default=False,
        ),
    ] = None,
    dead_letter_routing_key: Annotated[
        str | None,
        typer.Option(
            "--dead-letter-routing-key",
            help="Dead letters' routing key (default: the message's own).",
            show_default=False,
        ),
    ] = None,
    visibility_timeout_ms: Annotated[
        int,
        typer.Option(
            "--visibility-timeout-ms",
            min=0,
            help="A delivery not settled in this time is taken back and redelivered "
            "(ms; 0: held until its consumer or connection goes).",
        ),
    ] = 0,
    passive: Annotated[
        bool,
        typer.Option(
            "--passive",
            help="Only check that the queue exists (the settings are not compared).",
            show_default=False,
        ),
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Declare a queue: create it, or check that the queue of that name has these settings
    (other settings: an error, nothing changed)."""
    if exclusive and durable:
        fail("--exclusive queues are transient: add --transient", EXIT_USAGE)
    if dead_letter_routing_key is not None and dead_letter_exchange is None:
        fail("--dead-letter-routing-key needs --dead-letter-exchange", EXIT_USAGE)

    async def body(client: AsyncClient) -> object:
        return await client.declare_queue(
            name,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            max_deliveries=max_deliveries,
            message_ttl_ms=message_ttl_ms,
            max_length=max_length,
            max_length_bytes=max_length_bytes,
            overflow=str(overflow),
            dead_letter_exchange=(
                None if dead_letter_exchange is None else to_exchange(dead_letter_exchange)
            ),
            dead_letter_routing_key=dead_letter_routing_key or "",
            visibility_timeout_ms=visibility_timeout_ms,
            passive=passive,
        )

    info = run_client(addr, body)
    if as_json:
        echo_json(queue_doc(info))
    elif passive:
        doc = queue_doc(info)
        typer.echo(f"queue {name!r} exists: {doc.get('ready', 0):,} message(s) ready")
    else:
        kind = "durable" if durable else "transient"
        typer.echo(f"declared {kind} queue {name!r}")


@queue_app.command("delete")
def queue_delete(
    name: QueueArg,
    if_empty: Annotated[
        bool,
        typer.Option("--if-empty", help="Refuse if the queue holds messages.", show_default=False),
    ] = False,
    if_unused: Annotated[
        bool,
        typer.Option("--if-unused", help="Refuse if the queue has consumers.", show_default=False),
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Delete a queue, its messages and its bindings."""

    async def body(client: AsyncClient) -> int:
        return await client.delete_queue(name, if_empty=if_empty, if_unused=if_unused)

    dropped = run_client(addr, body)
    if as_json:
        echo_json({"queue": name, "messages": dropped})
    else:
        typer.echo(f"deleted queue {name!r} ({dropped:,} message(s) dropped)")


@queue_app.command("purge")
def queue_purge(
    name: QueueArg, addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False
) -> None:
    """Remove a queue's ready messages (those delivered and not yet settled stay)."""

    async def body(client: AsyncClient) -> int:
        return await client.purge_queue(name)

    purged = run_client(addr, body)
    if as_json:
        echo_json({"queue": name, "messages": purged})
    else:
        typer.echo(f"purged {purged:,} message(s) from queue {name!r}")


@queue_app.command("list")
def queue_list(addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False) -> None:
    """List the queues with their message counts (ready, unacked, delayed) and consumers."""

    async def body(client: AsyncClient) -> list[Any]:
        return list(await client.list_queues())

    docs = sorted((queue_doc(q) for q in run_client(addr, body)), key=lambda d: d["name"])
    if as_json:
        echo_json(docs)
        return
    console = Console(highlight=False, soft_wrap=True)
    table = Table("queue", "durable", "ready", "unacked", "delayed", "consumers", "bytes")
    for d in docs:
        table.add_row(
            d["name"],
            "yes" if d.get("durable") else "no",
            f"{d.get('ready', 0):,}",
            f"{d.get('unacked', 0):,}",
            f"{d.get('delayed', 0):,}",
            f"{d.get('consumers', 0):,}",
            f"{d.get('bytes', 0):,}",
        )
    console.print(table)


#: The settings ``queue describe`` shows, in this order.
_SETTINGS = (
    "durable",
    "exclusive",
    "auto_delete",
    "max_deliveries",
    "message_ttl_ms",
    "max_length",
    "max_length_bytes",
    "overflow",
    "dead_letter_exchange",
    "dead_letter_routing_key",
    "visibility_timeout_ms",
)


@queue_app.command("describe")
def queue_describe(
    name: QueueArg, addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False
) -> None:
    """Show a queue's settings, its messages (ready, unacked, delayed, bytes), consumers and
    counters (published, delivered, acked, redelivered, dead-lettered, expired, dropped)."""

    async def body(client: AsyncClient) -> object:
        return await client.declare_queue(name, passive=True)

    doc = queue_doc(run_client(addr, body))
    if as_json:
        echo_json(doc)
        return
    console = Console(highlight=False, soft_wrap=True)
    console.print(
        f"queue {doc['name']}: {doc.get('ready', 0):,} ready, {doc.get('unacked', 0):,} "
        f"unacked, {doc.get('delayed', 0):,} delayed, {doc.get('bytes', 0):,} bytes, "
        f"{doc.get('consumers', 0):,} consumer(s)"
    )
    settings = Table("setting", "value")
    for key in _SETTINGS:
        if key in doc:
            value = doc[key]
            settings.add_row(
                key,
                "(none)" if value is None else f"{value:,}" if _is_int(value) else str(value),
            )
    console.print(settings)
    counters = doc.get("counters")
    if isinstance(counters, Mapping):
        table = Table("counter", "messages")
        for key, value in counters.items():
            table.add_row(key, f"{value:,}" if _is_int(value) else str(value))
        console.print(table)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- bindings ------------------------------------------------------------------------------


def _binding_target(queue: str | None, topic: str | None) -> tuple[str, str]:
    if (queue is None) == (topic is None):
        fail("give one destination: --queue Q or --topic T", EXIT_USAGE)
    return ("queue", queue) if queue is not None else ("topic", topic or "")


BindExchange = Annotated[
    str,
    typer.Option("--exchange", "-e", help="The exchange the binding is on.", show_default=False),
]
BindQueue = Annotated[
    str | None, typer.Option("--queue", "-q", help="Route into this queue.", show_default=False)
]
BindTopic = Annotated[
    str | None,
    typer.Option(
        "--topic", help="Route into this topic (appended like a publish).", show_default=False
    ),
]
BindKey = Annotated[
    str,
    typer.Option(
        "--key",
        "-k",
        help="The binding key: direct: the routing key to match; topic: a pattern with * "
        "and #; fanout and headers: ignored.",
    ),
]
BindArgs = Annotated[
    list[str] | None,
    typer.Option(
        "--arg",
        help="Headers exchange: a header KEY=VALUE to match (repeatable); x-match=any "
        "matches one of them, x-match=all (the default) every one.",
        metavar="KEY=VALUE",
    ),
]


def bind(
    exchange: BindExchange,
    queue: BindQueue = None,
    topic: BindTopic = None,
    key: BindKey = "",
    arg: BindArgs = None,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Bind an exchange to a queue or a topic (binding twice is no error)."""
    _bind(exchange, queue, topic, key, arg, addr, as_json, unbind=False)


def unbind(
    exchange: BindExchange,
    queue: BindQueue = None,
    topic: BindTopic = None,
    key: BindKey = "",
    arg: BindArgs = None,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Remove a binding: the same --exchange, destination, --key and --arg as it was made
    with (a binding that does not exist is no error)."""
    _bind(exchange, queue, topic, key, arg, addr, as_json, unbind=True)


def _bind(
    exchange: str,
    queue: str | None,
    topic: str | None,
    key: str,
    arg: list[str] | None,
    addr: str,
    as_json: bool,
    *,
    unbind: bool,
) -> None:
    kind, destination = _binding_target(queue, topic)
    wire = to_exchange(exchange)
    if not wire:
        fail(
            f"{DEFAULT_EXCHANGE_NAME} routes to the queue its routing key names: nothing can "
            "be bound to it",
            EXIT_USAGE,
        )
    arguments = parse_args(arg or [], "--arg")

    async def body(client: AsyncClient) -> None:
        call = client.unbind if unbind else client.bind
        await call(wire, destination, key, arguments=arguments or None, destination_kind=kind)

    run_client(addr, body)
    if as_json:
        echo_json(
            {
                "exchange": exchange,
                "destination": destination,
                "destination_kind": kind,
                "key": key,
                "arguments": arguments,
            }
        )
    else:
        verb = "unbound" if unbind else "bound"
        typer.echo(
            f"{verb} exchange {exchange!r} {'from' if unbind else 'to'} {kind} "
            f"{destination!r} with key {key!r}"
        )
