"""``tidewire group``: list, describe, reset and delete consumer groups."""

from __future__ import annotations

import time
from typing import Annotated

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from tidewire.client import AsyncClient
from tidewire.protocol.messages import DescribeGroupResponse, GroupSummary, ResetOffsetResult

from ._common import (
    DEFAULT_ADDR,
    EXIT_USAGE,
    AddrOption,
    JsonOption,
    echo_json,
    fail,
    run_client,
)
from ._consume import parse_since

__all__ = ["group_app"]

group_app = typer.Typer(name="group", help="List, describe, reset and delete consumer groups.")

GroupArg = Annotated[str, typer.Argument(help="The group.", show_default=False)]


@group_app.command("list")
def list_(addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False) -> None:
    """List the groups (with members or committed offsets): id, state, members."""

    async def body(client: AsyncClient) -> list[GroupSummary]:
        return await client.list_groups()

    groups = run_client(addr, body)
    if as_json:
        echo_json([msgspec.structs.asdict(g) for g in groups])
        return
    for g in groups:
        typer.echo(f"{g.group_id}\t{g.state}\t{g.members} member(s)")


@group_app.command("describe")
def describe(group: GroupArg, addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False) -> None:
    """Show a group's state, members with their partitions, and per partition the committed
    offset, the end offset and the lag."""

    async def body(client: AsyncClient) -> DescribeGroupResponse:
        return await client.describe_group(group)

    d = run_client(addr, body)
    if as_json:
        echo_json(_describe_doc(d))
        return
    console = Console(highlight=False, soft_wrap=True)
    console.print(
        f"group {d.group_id}: {d.state}, generation {d.generation}, "
        f"{len(d.members)} member(s)" + (f", strategy {d.strategy}" if d.strategy else "")
    )
    owner = {(tp.topic, tp.partition): m.member_id for m in d.members for tp in m.assignment}
    if d.members:
        members = Table("member", "instance", "client", "partitions")
        for m in d.members:
            parts = ", ".join(f"{tp.topic}/{tp.partition}" for tp in m.assignment) or "-"
            members.add_row(m.member_id, m.group_instance_id or "-", m.client_id or "-", parts)
        console.print(members)
    offsets = Table("topic", "partition", "committed", "end offset", "lag", "member")
    for x in d.offsets:
        offsets.add_row(
            x.topic,
            str(x.partition),
            "-" if x.committed < 0 else str(x.committed),
            str(x.end_offset),
            "-" if x.lag < 0 else str(x.lag),
            owner.get((x.topic, x.partition), "-"),
        )
    console.print(offsets)


@group_app.command("reset")
def reset(
    group: GroupArg,
    topic: Annotated[str, typer.Option(help="The topic.", show_default=False)],
    to_earliest: Annotated[
        bool, typer.Option("--to-earliest", help="To the oldest message.", show_default=False)
    ] = False,
    to_latest: Annotated[
        bool, typer.Option("--to-latest", help="To the end: skip everything.", show_default=False)
    ] = False,
    to_offset: Annotated[
        int | None,
        typer.Option("--to-offset", min=0, help="To this offset (clamped to each log's range)."),
    ] = None,
    to_time: Annotated[
        str | None,
        typer.Option(
            "--to-time",
            help="To the first message at or after TIME: ISO-8601 or back from now (10m, 2h).",
            metavar="TIME",
        ),
    ] = None,
    partition: Annotated[
        list[int] | None,
        typer.Option("--partition", "-p", min=0, help="Only this partition (repeatable)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would change; commit nothing.")
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Move the committed offsets of a group with no members (stop its consumers first)."""
    given = to_earliest + to_latest + (to_offset is not None) + (to_time is not None)
    if given != 1:
        fail("give exactly one of --to-earliest, --to-latest, --to-offset, --to-time", EXIT_USAGE)
    value = 0
    if to_earliest:
        to = "earliest"
    elif to_latest:
        to = "latest"
    elif to_offset is not None:
        to, value = "offset", to_offset
    else:
        to = "timestamp"
        try:
            value = parse_since(str(to_time), time.time_ns() // 1_000_000)
        except ValueError as exc:
            fail(str(exc).replace("--since", "--to-time"), EXIT_USAGE)

    async def body(client: AsyncClient) -> list[ResetOffsetResult]:
        return await client.reset_group_offsets(
            group, topic, to, value=value, partitions=partition or None, dry_run=dry_run
        )

    results = run_client(addr, body)
    if as_json:
        echo_json(
            {
                "group": group,
                "dry_run": dry_run,
                "partitions": [msgspec.structs.asdict(r) for r in results],
            }
        )
        return
    verb = "would move" if dry_run else "moved"
    for r in results:
        before = "-" if r.previous < 0 else str(r.previous)
        typer.echo(f"{r.topic}/{r.partition}: {verb} {before} -> {r.offset}")


@group_app.command("delete")
def delete(group: GroupArg, addr: AddrOption = DEFAULT_ADDR) -> None:
    """Delete a group with no members, and its committed offsets."""

    async def body(client: AsyncClient) -> None:
        await client.delete_group(group)

    run_client(addr, body)
    typer.echo(f"deleted group {group!r}")


def _describe_doc(d: DescribeGroupResponse) -> dict[str, object]:
    return {
        "group": d.group_id,
        "state": d.state,
        "generation": d.generation,
        "strategy": d.strategy,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "topics": m.topics,
                "pattern": m.pattern,
                "assignment": [[tp.topic, tp.partition] for tp in m.assignment],
            }
            for m in d.members
        ],
        "offsets": [
            {
                "topic": x.topic,
                "partition": x.partition,
                "committed": x.committed,
                "end_offset": x.end_offset,
                "lag": x.lag,
            }
            for x in d.offsets
        ],
    }
