"""``tidewire health``: is the broker there and answering?"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import msgspec
import typer

from tidewire.client import AsyncClient
from tidewire.errors import RequestTimedOutError, TidewireError
from tidewire.protocol.messages import StorageProblem

from ._common import (
    DEFAULT_ADDR,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    AddrOption,
    JsonOption,
    check_addr,
    cli_credentials,
    cli_tls,
    echo_json,
)

__all__ = ["health"]


def health(
    addr: AddrOption = DEFAULT_ADDR,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=0.001, help="Give up after this long, connecting included (s)."
        ),
    ] = 5.0,
    as_json: JsonOption = False,
) -> None:
    """Connect, ping, print the server's version and the round-trip time, and every
    partition that does not serve all it holds: damaged ranges of a log, quarantined ranges,
    offline partitions (the first line then says "degraded").

    Exit code 0: the broker answers (healthy or degraded); 1: it does not (the reason is
    printed).
    """
    check_addr(addr)
    try:
        version, rtt_s, problems, total = asyncio.run(_probe(addr, timeout))
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except TidewireError as exc:
        if as_json:
            echo_json({"healthy": False, "addr": addr, "error": exc.message})
        else:
            typer.echo(f"unhealthy: {addr}: {exc.message}", err=True)
        raise typer.Exit(EXIT_ERROR) from None
    rtt_ms = round(rtt_s * 1000, 3)
    if as_json:
        doc: dict[str, object] = {
            "healthy": True,
            "addr": addr,
            "server_version": version,
            "rtt_ms": rtt_ms,
        }
        if total:
            doc["degraded"] = True
            doc["problems"] = [msgspec.to_builtins(p) for p in problems]
            doc["problems_total"] = total
        echo_json(doc)
        return
    state = "degraded" if total else "healthy"
    typer.echo(f"{state}: tidewire {version} at {addr}, round trip {rtt_ms:.3f} ms")
    for p in problems:
        typer.echo(f"  {_problem_line(p)}")
    if total > len(problems):
        typer.echo(f"  ... and {total - len(problems)} more")


def _problem_line(p: StorageProblem) -> str:
    where = f"{p.topic} partition {p.partition}"
    if p.kind == "offline":
        return f"{where}: offline: {p.reason}"
    offsets = f"offsets {p.start}..{p.end - 1} ({p.size_bytes:,} bytes)"
    if p.kind == "quarantined":
        return f"{where}: {offsets} quarantined to {p.file}; read past as a gap"
    return f"{where}: {offsets} damaged in {p.file}: {p.reason}; see `tidewire topic repair`"


async def _probe(addr: str, timeout_s: float) -> tuple[str, float, list[StorageProblem], int]:
    """(server version, ping round trip in seconds); the connection is opened first, so the
    round trip measures the request alone."""
    try:
        async with (
            asyncio.timeout(timeout_s),
            AsyncClient(
                addr,
                request_timeout_s=timeout_s,
                connect_timeout_s=timeout_s,
                tls=cli_tls(),
                credentials=cli_credentials(),
            ) as client,
        ):
            version = await client.server_version()
            start = time.perf_counter()
            await client.ping()
            rtt = time.perf_counter() - start
            problems, total = await client.storage_problems()
            return version, rtt, problems, total
    except TimeoutError:
        raise RequestTimedOutError(f"no answer within {timeout_s:g} s") from None
