"""``tidewire topic``: create, list, describe, alter, reassign, repair and delete topics."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from tidewire.client import AsyncClient
from tidewire.protocol.messages import (
    DamageInfo,
    PartitionReplication,
    RepairResult,
    TopicConfig,
    TopicDescription,
)
from tidewire.storage import FsyncPolicy

from ._common import (
    DEFAULT_ADDR,
    EXIT_ERROR,
    EXIT_USAGE,
    AddrOption,
    JsonOption,
    echo_json,
    fail,
    run_client,
)

__all__ = ["topic_app"]

topic_app = typer.Typer(
    name="topic", help="Create, list, describe, alter, reassign, repair and delete topics."
)

NameArg = Annotated[str, typer.Argument(help="The topic.", show_default=False)]
RetentionMs = Annotated[
    int | None, typer.Option(help="Delete segments whose newest record is older (ms; -1: keep).")
]
RetentionBytes = Annotated[
    int | None, typer.Option(help="Delete oldest segments beyond this size (bytes; -1: keep).")
]
SegmentBytes = Annotated[int | None, typer.Option(help="Roll segments at this size (bytes).")]
SegmentMs = Annotated[int | None, typer.Option(help="Roll segments at this age (ms).")]
Fsync = Annotated[
    FsyncPolicy | None,
    typer.Option(help="Durability: always (ack after fsync), interval, never."),
]
FlushIntervalMs = Annotated[
    int | None, typer.Option(help="fsync period under --fsync interval (ms).")
]
MaxMessageBytes = Annotated[
    int | None, typer.Option(help="The largest record batch the topic accepts (bytes).")
]


def _topic_config(
    retention_ms: int | None,
    retention_bytes: int | None,
    segment_bytes: int | None,
    segment_ms: int | None,
    fsync: FsyncPolicy | None,
    flush_interval_ms: int | None,
    max_message_bytes: int | None,
) -> TopicConfig:
    return TopicConfig(
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        segment_bytes=segment_bytes,
        segment_ms=segment_ms,
        fsync=None if fsync is None else str(fsync),
        flush_interval_ms=flush_interval_ms,
        max_message_bytes=max_message_bytes,
    )


@topic_app.command("create")
def create(
    name: Annotated[
        str | None, typer.Argument(metavar="NAME", help="The topic.", show_default=False)
    ] = None,
    name_opt: Annotated[
        str | None, typer.Option("--name", help="The topic (another way to give NAME).")
    ] = None,
    partitions: Annotated[
        int | None, typer.Option(help="Partitions (default: the broker's default_partitions).")
    ] = None,
    retention_ms: RetentionMs = None,
    retention_bytes: RetentionBytes = None,
    segment_bytes: SegmentBytes = None,
    segment_ms: SegmentMs = None,
    fsync: Fsync = None,
    flush_interval_ms: FlushIntervalMs = None,
    max_message_bytes: MaxMessageBytes = None,
    replication_factor: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="In a cluster: copies of each partition (default: the nodes' "
            "--default-replication-factor, at most the live nodes).",
        ),
    ] = None,
    min_insync_replicas: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="In a cluster: in-sync replicas an acks=all produce needs, "
            "1..replication factor (default: the nodes' --min-insync-replicas).",
        ),
    ] = None,
    unclean_leader_election: Annotated[
        bool | None,
        typer.Option(
            "--unclean-leader-election/--no-unclean-leader-election",
            help="In a cluster: whether a replica outside the ISR may lead when none in it "
            "is left, losing what only the lost replicas held (default: no).",
            show_default=False,
        ),
    ] = None,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Create a topic; settings not given are the broker's defaults."""
    if name is not None and name_opt is not None:
        fail("give the topic once: NAME or --name", EXIT_USAGE)
    name = name if name is not None else name_opt
    if name is None:
        fail("give the topic's NAME (or --name)", EXIT_USAGE)
    config = _topic_config(
        retention_ms,
        retention_bytes,
        segment_bytes,
        segment_ms,
        fsync,
        flush_interval_ms,
        max_message_bytes,
    )

    async def body(client: AsyncClient) -> TopicDescription:
        await client.create_topic(
            name,
            partitions,
            config,
            replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas,
            unclean_leader_election=unclean_leader_election,
        )
        return await client.describe_topic(name)

    desc = run_client(addr, body)
    if as_json:
        echo_json(_describe_doc(desc))
    else:
        typer.echo(f"created topic {name!r} with {len(desc.partitions)} partition(s)")


@topic_app.command("list")
def list_(addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False) -> None:
    """List the topics, one name a line."""

    async def body(client: AsyncClient) -> list[str]:
        return await client.list_topics()

    names = run_client(addr, body)
    if as_json:
        echo_json(names)
    else:
        for name in names:
            typer.echo(name)


@topic_app.command("describe")
def describe(name: NameArg, addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False) -> None:
    """Show a topic's partitions (start and end offsets, size), their damaged ranges and
    offline partitions if any, and the settings."""

    async def body(client: AsyncClient) -> TopicDescription:
        return await client.describe_topic(name)

    desc = run_client(addr, body)
    if as_json:
        echo_json(_describe_doc(desc))
        return
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"topic {desc.name}: {len(desc.partitions)} partition(s)")
    parts = Table("partition", "start offset", "end offset", "high watermark", "size (bytes)")
    for p in desc.partitions:
        parts.add_row(
            str(p.partition),
            str(p.log_start_offset),
            str(p.log_end_offset),
            str(p.high_watermark),
            f"{p.size_bytes:,}",
        )
    console.print(parts)
    for p in desc.partitions:
        if p.offline:
            console.print(f"partition {p.partition} is OFFLINE: {p.offline}")
        for d in p.damage:
            console.print(_damage_line(p.partition, d))
    settings = Table("setting", "value")
    for key, value in (msgspec.structs.asdict(desc.config) | _cluster_settings(desc)).items():
        if value is not None:
            shown = str(value).lower() if isinstance(value, bool) else None
            if shown is None:
                shown = f"{value:,}" if isinstance(value, int) else str(value)
            settings.add_row(key, shown)
    console.print(settings)


@topic_app.command("alter")
def alter(
    name: NameArg,
    partitions: Annotated[
        int | None, typer.Option(help="New partition count (only more than today).")
    ] = None,
    retention_ms: RetentionMs = None,
    retention_bytes: RetentionBytes = None,
    segment_bytes: SegmentBytes = None,
    segment_ms: SegmentMs = None,
    fsync: Fsync = None,
    flush_interval_ms: FlushIntervalMs = None,
    max_message_bytes: MaxMessageBytes = None,
    min_insync_replicas: Annotated[
        int | None,
        typer.Option(help="In a cluster: in-sync replicas an acks=all produce needs."),
    ] = None,
    unclean_leader_election: Annotated[
        bool | None,
        typer.Option(
            "--unclean-leader-election/--no-unclean-leader-election",
            help="In a cluster: whether a replica outside the ISR may be elected.",
            show_default=False,
        ),
    ] = None,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Add partitions and/or change settings of a topic; what is not given stays. In a
    cluster the change goes through etcd and every replica applies it."""
    config = _topic_config(
        retention_ms,
        retention_bytes,
        segment_bytes,
        segment_ms,
        fsync,
        flush_interval_ms,
        max_message_bytes,
    )
    cluster_settings = min_insync_replicas is not None or unclean_leader_election is not None
    if partitions is None and config == TopicConfig() and not cluster_settings:
        fail("nothing to change: give --partitions or a setting (see --help)", EXIT_USAGE)

    async def body(client: AsyncClient) -> TopicDescription:
        if partitions is not None or config != TopicConfig():
            await client.alter_topic(name, partitions=partitions, config=config)
        if cluster_settings:
            await client.alter_replication(
                name,
                min_insync_replicas=min_insync_replicas,
                unclean_leader_election=unclean_leader_election,
            )
        return await client.describe_topic(name)

    desc = run_client(addr, body)
    if as_json:
        echo_json(_describe_doc(desc))
    else:
        typer.echo(f"altered topic {name!r}: {len(desc.partitions)} partition(s)")


def _node_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"--replicas {text!r}: node ids separated by commas, e.g. 2,3,1", EXIT_USAGE)
    if not ids:
        fail("--replicas: at least one node id", EXIT_USAGE)
    return ids


def _moves_doc(name: str, moves: list[PartitionReplication]) -> dict[str, object]:
    return {
        "topic": name,
        "in_progress": sum(1 for m in moves if m.target),
        "partitions": [msgspec.to_builtins(m) for m in moves],
    }


@topic_app.command("reassign")
def reassign(
    name: NameArg,
    partition: Annotated[
        list[int] | None,
        typer.Option(help="The partition to move (repeat with --replicas for several)."),
    ] = None,
    replicas: Annotated[
        list[str] | None,
        typer.Option(
            help="Its new replicas, node ids in order (the first leads), e.g. 2,3,1; one "
            "--replicas per --partition."
        ),
    ] = None,
    replication_factor: Annotated[
        int | None,
        typer.Option(help="Give every partition this many replicas (moves as needed)."),
    ] = None,
    status: Annotated[
        bool, typer.Option("--status", help="Only show the moves under way.", show_default=False)
    ] = False,
    cancel: Annotated[
        bool,
        typer.Option(
            "--cancel",
            help="Cancel the moves under way (of each --partition given, else all): each "
            "partition goes back to the replicas it had before, the new ones removed.",
            show_default=False,
        ),
    ] = False,
    wait: Annotated[
        bool,
        typer.Option("--wait", help="Return once every move has ended.", show_default=False),
    ] = False,
    timeout: Annotated[float, typer.Option(help="Bound of --wait (seconds).")] = 300.0,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Move a cluster topic's partitions to other nodes (docs/cluster.md, "Reassigning
    partitions"): new replicas copy the log and join the ISR, then the leader moves if it
    is not among them and the replicas left delete their logs. Nothing acknowledged is lost.
    --cancel stops moves under way and goes back to the replicas each partition had.
    """
    parts, sets = partition or [], replicas or []
    if cancel:
        if sets or replication_factor is not None or status:
            fail("--cancel takes only --partition (which moves to cancel; none: all)", EXIT_USAGE)
        sets = [""] * len(parts)
    if len(parts) != len(sets):
        fail("give one --replicas for each --partition", EXIT_USAGE)
    if status and (parts or replication_factor is not None):
        fail("--status changes nothing: leave out --partition and --replication-factor", EXIT_USAGE)
    if not status and not cancel and not parts and replication_factor is None:
        fail("give --partition P --replicas IDS, --replication-factor N or --status", EXIT_USAGE)
    if parts and replication_factor is not None:
        fail("give either --partition/--replicas or --replication-factor", EXIT_USAGE)
    if len(set(parts)) != len(parts):
        fail("a partition is named twice", EXIT_USAGE)
    targets = {} if cancel else {p: _node_ids(r) for p, r in zip(parts, sets, strict=True)}

    async def body(client: AsyncClient) -> list[PartitionReplication]:
        if cancel:
            return await client.alter_replication(name, cancel=True, partitions=parts)
        moves = await client.alter_replication(
            name, replicas=targets or None, replication_factor=replication_factor
        )
        deadline = time.monotonic() + timeout
        while wait and any(m.target for m in moves):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
            moves = await client.alter_replication(name)
        return moves

    moves = run_client(addr, body, request_timeout_s=max(30.0, timeout if wait else 30.0))
    if as_json:
        echo_json(_moves_doc(name, moves))
    else:
        table = Table(title=f"topic {name}")
        for col in ("partition", "replicas", "isr", "leader", "epoch", "moving to"):
            table.add_column(col)
        for m in moves:
            table.add_row(
                str(m.partition),
                ",".join(map(str, m.replicas)),
                ",".join(map(str, m.isr)),
                str(m.leader),
                str(m.leader_epoch),
                ",".join(map(str, m.target)) or "-",
            )
        Console().print(table)
    if wait and any(m.target for m in moves):
        fail(f"moves still under way after {timeout:.0f} s (see --status)", EXIT_ERROR)


def _damage_line(partition: int, d: DamageInfo) -> str:
    where = f"partition {partition}: offsets {d.start}..{d.end - 1} ({d.size_bytes:,} bytes"
    if d.quarantined:
        return f"{where}) quarantined to {d.quarantined}; readers pass them as a gap"
    return (
        f"{where} at byte {d.position:,} of {d.file}) DAMAGED: {d.reason}; "
        "never served (see `tidewire topic repair`)"
    )


@topic_app.command("repair")
def repair(
    name: NameArg,
    partition: Annotated[
        int | None,
        typer.Option("--partition", "-p", min=0, help="Only this partition (default: all)."),
    ] = None,
    quarantine: Annotated[
        bool,
        typer.Option(
            "--quarantine",
            help="Copy each damaged range's bytes to a file beside its log and let readers "
            "pass the range as a gap (the records in it are lost to them).",
            show_default=False,
        ),
    ] = False,
    truncate: Annotated[
        bool,
        typer.Option(
            "--truncate",
            help="Cut each log where its first damaged range starts, removing every record "
            "from there on, good ones after the damage included (needs --yes).",
            show_default=False,
        ),
    ] = False,
    yes: Annotated[
        bool,
        typer.Option("--yes", help="Confirm --truncate.", show_default=False),
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Report a topic's damaged ranges; with --quarantine or --truncate, repair them.

    Without an option nothing changes: each damaged range is listed (offsets, bytes, file,
    reason). Exit code 0 also when there is no damage.
    """
    if quarantine and truncate:
        fail("give one of --quarantine, --truncate", EXIT_USAGE)
    if truncate and not yes:
        fail(
            "--truncate removes every record from the first damaged range on, good ones "
            "after it included: add --yes to confirm (or use --quarantine, which keeps them)",
            EXIT_USAGE,
        )
    action = "quarantine" if quarantine else "truncate" if truncate else "report"

    async def body(client: AsyncClient) -> list[RepairResult]:
        return await client.repair_topic(name, partition, action)

    results = run_client(addr, body)
    if as_json:
        echo_json([msgspec.structs.asdict(r) for r in results])
        return
    if not results:
        typer.echo(f"topic {name!r}: no damaged ranges")
        return
    for r in results:
        where = f"partition {r.partition}: offsets {r.start}..{r.end - 1} ({r.size_bytes:,} bytes)"
        if r.action == "quarantined":
            typer.echo(f"{where}: quarantined to {r.file}; readers now pass them as a gap")
        elif r.action == "truncated":
            typer.echo(
                f"{where}: truncated; {r.removed_offsets:,} offset(s) and "
                f"{r.removed_bytes:,} bytes removed, the log now ends at {r.log_end_offset}"
            )
        elif r.file.endswith(".quarantined"):
            typer.echo(f"{where}: quarantined to {r.file}")
        else:
            typer.echo(f"{where}: damaged in {r.file}: {r.reason}")


@topic_app.command("delete")
def delete(name: NameArg, addr: AddrOption = DEFAULT_ADDR) -> None:
    """Delete a topic and all its messages."""

    async def body(client: AsyncClient) -> None:
        await client.delete_topic(name)

    run_client(addr, body)
    typer.echo(f"deleted topic {name!r}")


def _describe_doc(desc: TopicDescription) -> dict[str, object]:
    return {
        "name": desc.name,
        "partitions": [
            {
                "partition": p.partition,
                "log_start_offset": p.log_start_offset,
                "log_end_offset": p.log_end_offset,
                "high_watermark": p.high_watermark,
                "size_bytes": p.size_bytes,
            }
            | ({"damage": [msgspec.structs.asdict(d) for d in p.damage]} if p.damage else {})
            | ({"offline": p.offline} if p.offline else {})
            for p in desc.partitions
        ],
        "config": msgspec.structs.asdict(desc.config),
    } | _cluster_settings(desc)


def _cluster_settings(desc: TopicDescription) -> dict[str, object]:
    """A cluster's topic settings (none on a single node)."""
    if not desc.replication_factor:
        return {}
    return {
        "replication_factor": desc.replication_factor,
        "min_insync_replicas": desc.min_insync_replicas,
        "unclean_leader_election": desc.unclean_leader_election,
    }
