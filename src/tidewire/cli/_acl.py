"""``tidewire acl``: add, remove and list ACL entries."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tidewire.client import AsyncClient
from tidewire.protocol.messages import AclEntry
from tidewire.security.model import CLUSTER_NAME, Operation, ResourceType

from ._common import (
    DEFAULT_ADDR,
    DEFAULT_MECHANISM,
    EXIT_USAGE,
    AddrOption,
    ApiKeyOption,
    JsonOption,
    SaslMechanismOption,
    credentials,
    echo_json,
    fail,
    run_client,
)
from ._user import to_doc

__all__ = ["acl_app"]

acl_app = typer.Typer(
    name="acl",
    help="Add, remove and list ACL entries: who may (or may not) do what on which resources.",
)

PrincipalOption = Annotated[
    str,
    typer.Option(
        "--principal",
        "-p",
        help="Who: a principal's name, role:NAME (everyone with that role) or '*' (anyone).",
        show_default=False,
    ),
]
TopicOption = Annotated[
    str | None,
    typer.Option("--topic", help="A topic (or prefix, with --prefix).", show_default=False),
]
GroupOption = Annotated[
    str | None,
    typer.Option(
        "--group", help="A consumer group (or prefix, with --prefix).", show_default=False
    ),
]
ClusterOption = Annotated[
    bool, typer.Option("--cluster", help="The cluster itself (administration).")
]
ResourceTypeOption = Annotated[
    str | None,
    typer.Option(
        "--resource-type",
        help="Another resource type, with --name: topic, group, cluster, queue, exchange, stream.",
        show_default=False,
    ),
]
NameOption = Annotated[
    str | None,
    typer.Option(
        "--name",
        help="The resource's name with --resource-type ('*': every one).",
        show_default=False,
    ),
]
PrefixOption = Annotated[
    bool, typer.Option("--prefix", help="The name is a prefix: every resource it begins.")
]
OperationOption = Annotated[
    list[str],
    typer.Option(
        "--operation",
        "-o",
        help=(
            "What (repeatable): read, write, create, delete, describe, alter, admin, "
            "cluster_action (--cluster: the nodes of a cluster), all."
        ),
        show_default=False,
    ),
]
DenyOption = Annotated[
    bool, typer.Option("--deny", help="Deny instead of allow (a deny wins over any allow).")
]


def _resource(
    topic: str | None,
    group: str | None,
    cluster: bool,
    resource_type: str | None,
    name: str | None,
) -> tuple[str, str]:
    """(resource type, pattern) of the one resource flag given."""
    given = (topic is not None) + (group is not None) + cluster + (resource_type is not None)
    if given != 1:
        fail("give exactly one of --topic, --group, --cluster, --resource-type", EXIT_USAGE)
    if topic is not None:
        return ResourceType.TOPIC, topic
    if group is not None:
        return ResourceType.GROUP, group
    if cluster:
        return ResourceType.CLUSTER, CLUSTER_NAME
    assert resource_type is not None
    if resource_type not in {r.value for r in ResourceType}:
        allowed = ", ".join(r.value for r in ResourceType)
        fail(f"--resource-type {resource_type!r} is not one of {allowed}", EXIT_USAGE)
    if resource_type == ResourceType.CLUSTER:
        return resource_type, name or CLUSTER_NAME
    if not name:
        fail(f"--resource-type {resource_type} needs --name (the resource, or '*')", EXIT_USAGE)
    return resource_type, name


def _entries(
    principal: str,
    resource: tuple[str, str],
    prefix: bool,
    operation: list[str],
    deny: bool,
) -> list[AclEntry]:
    ops = [o.strip().lower() for o in operation]
    allowed = {o.value for o in Operation}
    for o in ops:
        if o not in allowed:
            fail(f"--operation {o!r} is not one of {', '.join(sorted(allowed))}", EXIT_USAGE)
    rtype, pattern = resource
    return [
        AclEntry(
            principal=principal,
            resource_type=rtype,
            pattern=pattern,
            pattern_type="prefix" if prefix else "literal",
            operation=o,
            effect="deny" if deny else "allow",
        )
        for o in dict.fromkeys(ops)
    ]


def _table(entries: list[AclEntry]) -> Table:
    table = Table("principal", "effect", "operation", "resource", "name", "pattern")
    for e in entries:
        table.add_row(
            e.principal, e.effect, e.operation, e.resource_type, e.pattern, e.pattern_type
        )
    return table


def _print(entries: list[AclEntry], as_json: bool, verb: str) -> None:
    if as_json:
        echo_json([to_doc(e) for e in entries])
        return
    typer.echo(f"{verb} {len(entries)} ACL entr{'y' if len(entries) == 1 else 'ies'}")
    if entries:
        Console(highlight=False, soft_wrap=True).print(_table(entries))


@acl_app.command("add")
def acl_add(
    principal: PrincipalOption,
    operation: OperationOption,
    topic: TopicOption = None,
    group: GroupOption = None,
    cluster: ClusterOption = False,
    resource_type: ResourceTypeOption = None,
    name: NameOption = None,
    prefix: PrefixOption = False,
    deny: DenyOption = False,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Allow (or --deny) a principal, a role or anyone operations on a resource, e.g.
    `tidewire acl add --principal alice --topic orders --operation read`."""
    entries = _entries(
        principal, _resource(topic, group, cluster, resource_type, name), prefix, operation, deny
    )
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> list[AclEntry]:
        return await client.add_acls(entries)

    _print(run_client(addr, body, creds=creds), as_json, "added")


@acl_app.command("remove")
def acl_remove(
    principal: PrincipalOption,
    operation: OperationOption,
    topic: TopicOption = None,
    group: GroupOption = None,
    cluster: ClusterOption = False,
    resource_type: ResourceTypeOption = None,
    name: NameOption = None,
    prefix: PrefixOption = False,
    deny: DenyOption = False,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Remove ACL entries, given as they were added (same flags)."""
    entries = _entries(
        principal, _resource(topic, group, cluster, resource_type, name), prefix, operation, deny
    )
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> list[AclEntry]:
        return await client.remove_acls(entries)

    _print(run_client(addr, body, creds=creds), as_json, "removed")


@acl_app.command("list")
def acl_list(
    principal: Annotated[
        str | None,
        typer.Option(
            "--principal",
            "-p",
            help="Only this principal's, role's (role:NAME) or anyone's ('*') entries.",
            show_default=False,
        ),
    ] = None,
    topic: Annotated[
        str | None,
        typer.Option(
            "--topic",
            help="Only entries that cover this topic (literal, prefix or '*').",
            show_default=False,
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option("--group", help="Only entries that cover this group.", show_default=False),
    ] = None,
    resource_type: Annotated[
        str | None,
        typer.Option(
            "--resource-type", help="Only entries on this resource type.", show_default=False
        ),
    ] = None,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """List ACL entries, all or those that pass the filters given."""
    if (topic is not None) + (group is not None) + (resource_type is not None) > 1:
        fail("give at most one of --topic, --group, --resource-type", EXIT_USAGE)
    rtype, matching = resource_type or "", ""
    if topic is not None:
        rtype, matching = ResourceType.TOPIC, topic
    elif group is not None:
        rtype, matching = ResourceType.GROUP, group
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> list[AclEntry]:
        return await client.describe_acls(
            principal=principal or "", resource_type=rtype, matching=matching
        )

    entries = run_client(addr, body, creds=creds)
    if as_json:
        echo_json([to_doc(e) for e in entries])
        return
    if not entries:
        typer.echo("no ACL entries")
        return
    Console(highlight=False, soft_wrap=True).print(_table(entries))
