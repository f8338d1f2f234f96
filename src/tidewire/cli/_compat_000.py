"""``brokectl`` spellings (pubsub-broker's CLI) that map onto tidewire's own commands, so
that its README's commands run with ``tidewire`` in place of ``brokectl`` (docs/migrating.md):

- ``tidewire --addr HOST:PORT COMMAND ...``: ``--addr`` before the command is the default of
  that command's own ``--addr`` (:func:`addr_defaults`);
- ``tidewire consumer list``: ``tidewire group list``;
- ``tidewire tail --topic T --count N``: the last N messages of the topic, across all its
  partitions (or one with ``--partition``), oldest first, then exit.

``topic create --name`` and ``publish --topic --payload`` are options of those commands
themselves.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tidewire.client import AsyncClient
from tidewire.errors import UnknownPartitionError
from tidewire.records import Record

from ._common import DEFAULT_ADDR, EXIT_USAGE, AddrOption, JsonOption, fail, run_client
from ._consume import record_doc
from ._group import list_ as group_list

__all__ = ["addr_defaults", "consumer_app", "tail"]

#: Messages one ``tail`` prints at most: they are held in memory to be put in order.
TAIL_MAX = 100_000
#: Bytes one fetch of ``tail`` asks for per partition.
_FETCH_BYTES = 1024 * 1024


def addr_defaults(group: Any, addr: str) -> dict[str, Any]:
    """A ``default_map`` (of the command group's context) giving ``addr`` as the ``--addr``
    of every command below ``group`` that has one (its own ``--addr`` and ``TIDEWIRE_ADDR``
    still win)."""
    out: dict[str, Any] = {}
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group of commands
            out[name] = addr_defaults(cmd, addr)
        elif any(p.name == "addr" for p in cmd.params):
            out[name] = {"addr": addr}
    return out


consumer_app = typer.Typer(
    name="consumer", help="Consumer groups as brokectl names them: 'consumer list' is 'group list'."
)


@consumer_app.command("list")
def consumer_list(addr: AddrOption = DEFAULT_ADDR, as_json: JsonOption = False) -> None:
    """List the consumer groups (same as 'tidewire group list')."""
    group_list(addr=addr, as_json=as_json)


def tail(
    topic_arg: Annotated[
        str | None, typer.Argument(metavar="[TOPIC]", help="The topic.", show_default=False)
    ] = None,
    topic_opt: Annotated[
        str | None, typer.Option("--topic", "-t", help="The topic (another way to give TOPIC).")
    ] = None,
    count: Annotated[
        int, typer.Option("--count", "-n", min=1, max=TAIL_MAX, help="How many messages.")
    ] = 10,
    partition: Annotated[
        int | None,
        typer.Option("--partition", "-p", min=0, help="Only this partition (default: all)."),
    ] = None,
    json_lines: Annotated[
        bool,
        typer.Option("--json", help="One JSON object per message (as consume --format json)."),
    ] = False,
    addr: AddrOption = DEFAULT_ADDR,
) -> None:
    """Print the last --count messages of a topic, from every partition (or --partition),
    oldest first, as 'partition=P offset=O key=K VALUE' lines, and exit.

    To keep printing new messages as they arrive, use 'tidewire consume'.
    """
    if topic_arg is not None and topic_opt is not None:
        fail("give the topic once: TOPIC or --topic", EXIT_USAGE)
    topic = topic_opt if topic_opt is not None else topic_arg
    if topic is None:
        fail("give a TOPIC (or --topic)", EXIT_USAGE)

    async def body(client: AsyncClient) -> list[tuple[int, Record]]:
        desc = await client.describe_topic(topic)
        n = len(desc.partitions)
        if partition is not None and partition >= n:
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0..{n - 1}, not {partition}"
            )
        got: list[tuple[int, Record]] = []
        for info in desc.partitions:
            if partition is not None and info.partition != partition:
                continue
            end = info.high_watermark
            offset = max(info.log_start_offset, end - count)
            while offset < end:
                r = await client.fetch(topic, info.partition, offset, max_bytes=_FETCH_BYTES)
                got += [(info.partition, rec) for rec in r.records if rec.offset < end]
                if r.next_offset <= offset:
                    break
                offset = r.next_offset
        got.sort(key=lambda x: (x[1].timestamp, x[0], x[1].offset))
        return got[-count:]

    out = typer.get_binary_stream("stdout")
    for p, rec in run_client(addr, body):
        if json_lines:
            doc = record_doc(topic, p, rec)
            out.write(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode())
        else:
            key = b"-" if rec.key is None else rec.key
            out.write(b"partition=%d offset=%d key=%s " % (p, rec.offset, key))
            out.write(rec.value or b"")
        out.write(b"\n")
    out.flush()
