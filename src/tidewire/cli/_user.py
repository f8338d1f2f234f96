"""``tidewire user`` and ``tidewire key``: principals (users and service accounts), their
roles and their API keys."""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from tidewire.client import AsyncClient
from tidewire.protocol.messages import ApiKeyInfo, PrincipalInfo

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

__all__ = ["format_ms", "key_app", "parse_expires", "to_doc", "user_app"]

user_app = typer.Typer(
    name="user",
    help="Create, list, describe and delete principals (users and service accounts), and set "
    "their roles.",
)
key_app = typer.Typer(
    name="key", help="Create, list and revoke API keys (shown once, when created)."
)

NameArg = Annotated[str, typer.Argument(help="The principal.", show_default=False)]
RoleOption = Annotated[
    list[str] | None,
    typer.Option(
        "--role",
        "-r",
        help="A role (repeatable): admin, producer, consumer, viewer, node (a cluster's nodes), "
        "or one an ACL names (role:NAME).",
        show_default=False,
    ),
]
DescriptionOption = Annotated[
    str | None,
    typer.Option(
        "--description", "-d", help="What it is for (up to 256 characters).", show_default=False
    ),
]

_DURATION = re.compile(r"\s*(\d+)\s*(m|h|d|w|y)\s*")
_UNIT_MS = {
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 7 * 86_400_000,
    "y": 365 * 86_400_000,
}


def parse_expires(text: str, now_ms: int) -> int:
    """An ``--expires`` value as ms since the epoch (0: never).

    Args:
        text: ``never``, a duration from now (a number and ``m``, ``h``, ``d``, ``w`` or
            ``y``: ``30d``, ``12h``) or an ISO-8601 time (local time without an offset).
        now_ms: the present, ms since the epoch.

    Raises:
        ValueError: none of these forms, or a time not in the future.
    """
    if text.strip().lower() == "never":
        return 0
    m = _DURATION.fullmatch(text)
    if m:
        amount = int(m.group(1))
        if amount <= 0:
            raise ValueError(f"--expires {text!r}: a duration must be above 0")
        return now_ms + amount * _UNIT_MS[m.group(2)]
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--expires {text!r} is neither 'never', a duration (30d, 12h, 2w) nor an "
            "ISO-8601 time (2027-01-31T00:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()
    ms = int(when.timestamp() * 1000)
    if ms <= now_ms:
        raise ValueError(f"--expires {text!r} is not in the future")
    return ms


def format_ms(ms: int, zero: str = "-") -> str:
    """A time in ms since the epoch as ISO-8601 UTC to the second (``zero`` for 0)."""
    if not ms:
        return zero
    when = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def to_doc(value: Any) -> Any:
    """A message as JSON-ready builtins with every field, defaults included (the wire
    leaves them out)."""
    if isinstance(value, msgspec.Struct):
        return {f: to_doc(getattr(value, f)) for f in value.__struct_fields__}
    if isinstance(value, list | tuple):
        return [to_doc(v) for v in value]
    return value


def _principal_doc(p: PrincipalInfo) -> dict[str, Any]:
    return to_doc(p)  # type: ignore[no-any-return]


def _keys_table(keys: list[ApiKeyInfo], *, with_principal: bool) -> Table:
    cols = [
        "key id",
        *(["principal"] if with_principal else []),
        "state",
        "created",
        "expires",
        "description",
    ]
    table = Table(*cols)
    for k in keys:
        row = [
            k.id,
            *([k.principal] if with_principal else []),
            k.state,
            format_ms(k.created_ms),
            format_ms(k.expires_ms, "never"),
            k.description or "-",
        ]
        table.add_row(*row)
    return table


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


# --- user --------------------------------------------------------------------------------------


@user_app.command("create")
def user_create(
    name: NameArg,
    service: Annotated[
        bool, typer.Option("--service", help="A service account (default: a user).")
    ] = False,
    role: RoleOption = None,
    description: DescriptionOption = None,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Create a user or a service account, with roles. Give it a key with `tidewire key
    create NAME`."""
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> PrincipalInfo:
        return await client.create_principal(
            name,
            kind="service" if service else "user",
            roles=role or (),
            description=description or "",
        )

    p = run_client(addr, body, creds=creds)
    if as_json:
        echo_json(_principal_doc(p))
        return
    roles = ", ".join(p.roles) or "no roles"
    typer.echo(f"created {p.kind} {p.name} ({roles})")


@user_app.command("list")
def user_list(
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """List the principals: name, kind, roles, active keys, created, description."""
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> list[PrincipalInfo]:
        return await client.describe_principals()

    principals = run_client(addr, body, creds=creds)
    if as_json:
        echo_json([_principal_doc(p) for p in principals])
        return
    table = Table("name", "kind", "roles", "active keys", "created", "description")
    for p in principals:
        active = sum(1 for k in p.keys if k.state == "active")
        table.add_row(
            p.name,
            p.kind,
            ", ".join(p.roles) or "-",
            str(active),
            format_ms(p.created_ms),
            p.description or "-",
        )
    _console().print(table)


@user_app.command("describe")
def user_describe(
    name: NameArg,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Show a principal: kind, roles, description and its API keys (never a secret)."""
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> PrincipalInfo:
        (p,) = await client.describe_principals([name])
        return p

    p = run_client(addr, body, creds=creds)
    if as_json:
        echo_json(_principal_doc(p))
        return
    console = _console()
    console.print(
        f"{p.kind} {p.name}: roles {', '.join(p.roles) or '-'}, created {format_ms(p.created_ms)}"
    )
    if p.description:
        console.print(f"description: {p.description}")
    if p.keys:
        console.print(_keys_table(p.keys, with_principal=False))
    else:
        console.print("no API keys")


@user_app.command("delete")
def user_delete(
    name: NameArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Delete a principal with its API keys, ACL entries and quota (asks first unless
    --yes)."""
    creds = credentials(api_key, sasl_mechanism)
    if not yes and not typer.confirm(
        f"Delete principal {name!r} with its API keys, ACL entries and quota?"
    ):
        fail("not deleted")

    async def body(client: AsyncClient) -> tuple[int, int]:
        return await client.delete_principal(name)

    keys, acls = run_client(addr, body, creds=creds)
    if as_json:
        echo_json({"deleted": name, "keys_deleted": keys, "acls_deleted": acls})
        return
    typer.echo(f"deleted {name} with {keys} API key(s) and {acls} ACL entr(ies)")


@user_app.command("roles")
def user_roles(
    name: NameArg,
    role: RoleOption = None,
    clear: Annotated[bool, typer.Option("--clear", help="Take every role away.")] = False,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Replace a principal's roles with those given (--role, repeatable; --clear: none)."""
    if bool(role) == clear:
        fail("give the new roles with --role (repeatable), or --clear for none", EXIT_USAGE)
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> PrincipalInfo:
        return await client.alter_principal(name, roles=role or [])

    p = run_client(addr, body, creds=creds)
    if as_json:
        echo_json(_principal_doc(p))
        return
    typer.echo(f"{p.name}: roles {', '.join(p.roles) or '-'}")


# --- key ---------------------------------------------------------------------------------------


@key_app.command("create")
def key_create(
    principal: NameArg,
    expires: Annotated[
        str,
        typer.Option(
            "--expires",
            help="When the key expires: never, a duration from now (30d, 12h, 2w, 1y) or an "
            "ISO-8601 time.",
        ),
    ] = "never",
    description: DescriptionOption = None,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Create an API key for a principal and print it, once: the broker keeps only a hash,
    so it cannot be shown again (with --json: the field "api_key")."""
    try:
        expires_ms = parse_expires(expires, int(time.time() * 1000))
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> tuple[ApiKeyInfo, str]:
        return await client.create_api_key(
            principal, expires_ms=expires_ms, description=description or ""
        )

    info, whole = run_client(addr, body, creds=creds)
    if as_json:
        echo_json({**to_doc(info), "api_key": whole})
        return
    typer.echo(
        f"created API key {info.id} of {info.principal}, expires "
        f"{format_ms(info.expires_ms, 'never')}"
    )
    typer.echo(whole)
    typer.echo(
        "warning: this is the only time the key is shown: store it now (a secrets manager, "
        "or TIDEWIRE_API_KEY); lost, it can only be revoked and replaced",
        err=True,
    )


@key_app.command("list")
def key_list(
    principal: Annotated[
        str | None,
        typer.Argument(help="Only this principal's keys (default: every key).", show_default=False),
    ] = None,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """List API keys: id, principal, state (active, expired, revoked), created, expires,
    description. Never a secret."""
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> list[PrincipalInfo]:
        return await client.describe_principals(None if principal is None else [principal])

    keys = [k for p in run_client(addr, body, creds=creds) for k in p.keys]
    if as_json:
        echo_json([to_doc(k) for k in keys])
        return
    _console().print(_keys_table(keys, with_principal=True))


@key_app.command("revoke")
def key_revoke(
    key_id: Annotated[
        str, typer.Argument(help="The key's id (12 hex digits).", show_default=False)
    ],
    principal: Annotated[
        str | None,
        typer.Option(
            "--principal",
            help="The key's principal: lets a principal revoke its own key without the "
            "right to manage others'.",
            show_default=False,
        ),
    ] = None,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Revoke an API key: connections that authenticated with it are refused from their
    next request."""
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> ApiKeyInfo:
        return await client.revoke_api_key(key_id, principal=principal or "")

    info = run_client(addr, body, creds=creds)
    if as_json:
        echo_json(to_doc(info))
        return
    typer.echo(f"revoked API key {info.id} of {info.principal}")
