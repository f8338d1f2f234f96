"""What every client command shares: the broker address option, running a command against
an :class:`~tidewire.client.AsyncClient`, turning errors into one line on stderr, JSON out.

Exit codes: 0 success, 1 an error from the broker or the connection, 2 a usage error,
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, NoReturn, TypeVar

import typer

from tidewire.client import AsyncClient
from tidewire.client._transport import parse_addr
from tidewire.errors import TidewireError
from tidewire.security.credentials import Credentials

__all__ = [
    "DEFAULT_ADDR",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "AddrOption",
    "ApiKeyOption",
    "JsonOption",
    "SaslMechanismOption",
    "credentials",
    "echo_json",
    "fail",
    "run_client",
]

#: The broker the client commands talk to unless told otherwise.
DEFAULT_ADDR = "127.0.0.1:7400"
EXIT_ERROR = 1
EXIT_USAGE = 2
#: 128 + SIGINT, as a shell reports a command stopped by Ctrl-C.
EXIT_INTERRUPTED = 130

AddrOption = Annotated[
    str,
    typer.Option(
        "--addr",
        envvar="TIDEWIRE_ADDR",
        help="The broker, HOST:PORT.",
        show_envvar=True,
    ),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="TIDEWIRE_API_KEY",
        help="The API key to authenticate with (twk_...); prefer the environment variable, "
        "which other users cannot see in the process list.",
        show_envvar=True,
        show_default=False,
    ),
]
#: The default SASL mechanism.
DEFAULT_MECHANISM = "SCRAM-SHA-256"
SaslMechanismOption = Annotated[
    str,
    typer.Option(
        "--sasl-mechanism",
        envvar="TIDEWIRE_SASL_MECHANISM",
        help="How the API key is presented: SCRAM-SHA-256 (the secret never crosses the "
        "wire), SCRAM-SHA-512 or PLAIN (only over TLS, unless the broker allows it).",
        show_envvar=True,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON instead of text.", show_default=False)
]

T = TypeVar("T")


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def echo_json(doc: object) -> None:
    """Print one JSON document on one line."""
    typer.echo(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))


def check_addr(addr: str) -> None:
    """Exit with a usage error unless ``addr`` is ``HOST:PORT``."""
    try:
        parse_addr(addr)
    except ValueError as exc:
        fail(f"--addr: {exc}", EXIT_USAGE)


def credentials(api_key: str | None, mechanism: str = "SCRAM-SHA-256") -> Credentials | None:
    """The credentials of ``--api-key`` and ``--sasl-mechanism`` (None without a key)."""
    mechanism = mechanism.upper()
    if mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
        fail(
            f"--sasl-mechanism {mechanism!r} must be SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN",
            EXIT_USAGE,
        )
    if not api_key:
        return None
    try:
        return Credentials(api_key=api_key.strip(), mechanism=mechanism)
    except TidewireError as exc:  # not an API key: the message does not repeat it
        fail(f"--api-key: {exc.message}", EXIT_USAGE)


def run_client(
    addr: str,
    body: Callable[[AsyncClient], Awaitable[T]],
    *,
    request_timeout_s: float = 30.0,
    connect_timeout_s: float = 10.0,
    creds: Credentials | None = None,
) -> T:
    """Connect to ``addr``, run ``body`` with the client, close it, return what ``body``
    returned. An error from the broker or the connection prints one line on stderr and
    exits 1; Ctrl-C exits 130 after closing the connection."""
    check_addr(addr)

    async def main() -> T:
        async with AsyncClient(
            addr,
            request_timeout_s=request_timeout_s,
            connect_timeout_s=connect_timeout_s,
            credentials=creds,
        ) as client:
            return await body(client)

    try:
        return asyncio.run(main())
    except TidewireError as exc:
        fail(exc.message)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python from failing
        # again when it flushes stdout at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(EXIT_ERROR) from None
