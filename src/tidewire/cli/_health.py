"""``tidewire health``: is the broker there and answering?"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer

from tidewire.client import AsyncClient
from tidewire.errors import RequestTimedOutError, TidewireError

from ._common import (
    DEFAULT_ADDR,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    AddrOption,
    JsonOption,
    check_addr,
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
    """Connect, ping, print the server's version and the round-trip time.

    Exit code 0: healthy; 1: not (the reason is printed).
    """
    check_addr(addr)
    try:
        version, rtt_s = asyncio.run(_probe(addr, timeout))
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
        echo_json({"healthy": True, "addr": addr, "server_version": version, "rtt_ms": rtt_ms})
    else:
        typer.echo(f"healthy: tidewire {version} at {addr}, round trip {rtt_ms:.3f} ms")


async def _probe(addr: str, timeout_s: float) -> tuple[str, float]:
    """(server version, ping round trip in seconds); the connection is opened first, so the
    round trip measures the request alone."""
    try:
        async with (
            asyncio.timeout(timeout_s),
            AsyncClient(addr, request_timeout_s=timeout_s, connect_timeout_s=timeout_s) as client,
        ):
            version = await client.server_version()
            start = time.perf_counter()
            await client.ping()
            return version, time.perf_counter() - start
    except TimeoutError:
        raise RequestTimedOutError(f"no answer within {timeout_s:g} s") from None
