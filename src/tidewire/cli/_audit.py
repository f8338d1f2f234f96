"""``tidewire audit``: read the broker's audit log (who did what, from where, allowed or
denied)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Annotated

import msgspec
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tidewire.client import AsyncClient, AuditEvents
from tidewire.protocol.messages import AuditEventBody

from ._common import DEFAULT_ADDR, EXIT_USAGE, AddrOption, JsonOption, echo_json, fail, run_client
from ._consume import parse_since

__all__ = ["audit"]

#: Events shown unless --limit says otherwise.
DEFAULT_LIMIT = 100
#: The most one call may ask for (the broker's bound).
MAX_LIMIT = 10_000

TimeOption = "ISO-8601 (2024-05-01T12:00:00Z), ms since the epoch, or back from now (30m, 2h, 7d)"


def _time(option: str, text: str | None, now_ms: int) -> int | None:
    if text is None:
        return None
    try:
        return parse_since(text, now_ms)
    except ValueError as exc:
        fail(str(exc).replace("--since", option), EXIT_USAGE)


def format_time(ms: int) -> str:
    """``ms`` since the epoch as UTC ISO-8601 to the millisecond."""
    when = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def audit(
    since: Annotated[
        str | None,
        typer.Option(help=f"Only events at or after this time: {TimeOption}.", metavar="TIME"),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help=f"Only events before this time: {TimeOption}.", metavar="TIME"),
    ] = None,
    principal: Annotated[
        str | None,
        typer.Option(help='Only this principal\'s events ("": anonymous ones).', metavar="NAME"),
    ] = None,
    action: Annotated[
        str | None,
        typer.Option(
            help="Only this action: CREATE_TOPIC, authenticate, acl.add, ...", metavar="ACTION"
        ),
    ] = None,
    outcome: Annotated[
        str | None,
        typer.Option(help="Only this outcome: allowed, denied, failed or ok.", metavar="OUTCOME"),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(min=1, max=MAX_LIMIT, help="Show the newest N events that match."),
    ] = DEFAULT_LIMIT,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Show the audit log, oldest first: authentications, administrative operations, ACL
    and key changes, and denials, with who, from where, and the outcome."""
    # The audit module loads the storage engine: imported when the command runs.
    from tidewire.security.audit import OUTCOMES  # noqa: PLC0415

    if outcome is not None and outcome not in OUTCOMES:
        fail(f"--outcome {outcome!r} must be one of {', '.join(OUTCOMES)}", EXIT_USAGE)
    now = time.time_ns() // 1_000_000
    since_ms = _time("--since", since, now)
    until_ms = _time("--until", until, now)
    if since_ms is not None and until_ms is not None and until_ms < since_ms:
        fail(f"--until ({until}) is before --since ({since})", EXIT_USAGE)

    async def body(client: AsyncClient) -> AuditEvents:
        return await client.describe_audit(
            since_ms=since_ms,
            until_ms=until_ms,
            principal=principal,
            action=action,
            outcome=outcome,
            limit=limit,
        )

    events = run_client(addr, body)
    if events.missing_nodes:  # a cluster node that did not answer: partial, said on stderr
        nodes = ", ".join(str(n) for n in events.missing_nodes)
        typer.echo(
            f"warning: the audit logs of nodes {nodes} were not read (no node holding them "
            "answered); the events shown are partial",
            err=True,
        )
    if as_json:
        echo_json([_doc(e) for e in events])
        return
    console = Console(highlight=False, soft_wrap=True)
    if not events:
        console.print("no audit events match", markup=False)
        return
    table = Table()
    table.add_column("time (UTC)", no_wrap=True, min_width=19)
    clustered = any(e.node_id is not None for e in events)  # which node recorded it
    if clustered:
        table.add_column("node", no_wrap=True)
    for name in ("principal", "source", "action", "resource", "outcome", "reason"):
        table.add_column(name, overflow="fold")  # wrapped, never cut: an audit hides nothing
    for e in events:
        node = () if not clustered else (str(e.node_id) if e.node_id is not None else "-",)
        cells = (
            format_time(e.time_ms)[:19].replace("T", " "),
            *node,
            e.principal if e.principal is not None else "-",
            f"{e.source or '-'} ({e.interface})",
            e.action,
            e.resource or "-",
            e.outcome,
            e.reason,
        )
        table.add_row(*(Text(c) for c in cells))  # as text: "[key ...]" is not markup
    console.print(table)


def _doc(e: AuditEventBody) -> dict[str, object]:
    doc = msgspec.structs.asdict(e)
    if doc["node_id"] is None:  # a single node's
        del doc["node_id"]
    doc["time"] = format_time(e.time_ms)
    return doc
