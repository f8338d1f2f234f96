"""``tidewire quota``: set, clear and list principals' quotas."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tidewire.client import AsyncClient
from tidewire.protocol.messages import DescribeQuotasResponse, QuotaEntry

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

__all__ = ["quota_app"]

quota_app = typer.Typer(
    name="quota",
    help="Set, clear and list principals' quotas (produce and fetch bytes per second, "
    "requests per second).",
)

PrincipalArg = Annotated[str, typer.Argument(help="The principal.", show_default=False)]


def _rate(help_text: str, flag: str) -> object:
    return typer.Option(
        flag, min=-1, help=f"{help_text} (0: none; -1: the broker's default).", show_default=False
    )


@quota_app.command("set")
def quota_set(
    principal: PrincipalArg,
    produce_bytes_per_s: Annotated[
        int | None, _rate("Bytes per second it may produce", "--produce-bytes-per-s")
    ] = None,
    fetch_bytes_per_s: Annotated[
        int | None, _rate("Bytes per second it may fetch", "--fetch-bytes-per-s")
    ] = None,
    requests_per_s: Annotated[
        int | None, _rate("Requests per second of any kind", "--requests-per-s")
    ] = None,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Set some of a principal's quotas (those not given keep their value). Beyond a quota
    the broker delays its answers and tells the client how long."""
    if produce_bytes_per_s is None and fetch_bytes_per_s is None and requests_per_s is None:
        fail(
            "give at least one of --produce-bytes-per-s, --fetch-bytes-per-s, --requests-per-s",
            EXIT_USAGE,
        )
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> QuotaEntry:
        return await client.set_quota(
            principal,
            produce_bytes_per_s=produce_bytes_per_s,
            fetch_bytes_per_s=fetch_bytes_per_s,
            requests_per_s=requests_per_s,
        )

    q = run_client(addr, body, creds=creds)
    if as_json:
        echo_json(to_doc(q))
        return
    typer.echo(
        f"{q.principal}: produce {_show(q.produce_bytes_per_s)} B/s, fetch "
        f"{_show(q.fetch_bytes_per_s)} B/s, {_show(q.requests_per_s)} requests/s"
    )


@quota_app.command("clear")
def quota_clear(
    principal: PrincipalArg,
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """Clear a principal's own quotas: the broker's defaults apply again."""
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> None:
        await client.clear_quota(principal)

    run_client(addr, body, creds=creds)
    if as_json:
        echo_json({"cleared": principal})
        return
    typer.echo(f"{principal}: the broker's default quotas apply")


@quota_app.command("list")
def quota_list(
    addr: AddrOption = DEFAULT_ADDR,
    api_key: ApiKeyOption = None,
    sasl_mechanism: SaslMechanismOption = DEFAULT_MECHANISM,
    as_json: JsonOption = False,
) -> None:
    """List the principals with quotas of their own, and the broker's defaults (*)."""
    creds = credentials(api_key, sasl_mechanism)

    async def body(client: AsyncClient) -> DescribeQuotasResponse:
        return await client.describe_quotas()

    got = run_client(addr, body, creds=creds)
    if as_json:
        echo_json(
            {
                "quotas": [to_doc(q) for q in got.quotas],
                "defaults": None if got.defaults is None else to_doc(got.defaults),
            }
        )
        return
    table = Table("principal", "produce B/s", "fetch B/s", "requests/s")
    rows = [*got.quotas, *([got.defaults] if got.defaults is not None else [])]
    for q in rows:
        table.add_row(
            q.principal,
            _show(q.produce_bytes_per_s),
            _show(q.fetch_bytes_per_s),
            _show(q.requests_per_s),
        )
    Console(highlight=False, soft_wrap=True).print(table)


def _show(value: int | None) -> str:
    if value is None or value == -1:
        return "default"
    return "none" if value == 0 else f"{value:,}"
