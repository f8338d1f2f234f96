"""What every client command shares: the broker address option, the TLS options (added to
every command that takes ``--addr`` by :func:`add_tls_options`), the credential options
``--api-key`` and ``--sasl-mechanism`` (likewise, by :func:`add_credential_options`), running a
command against
an :class:`~tidewire.client.AsyncClient`, turning errors into one line on stderr, JSON out.

Exit codes: 0 success, 1 an error from the broker or the connection, 2 a usage error,
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import os
import sys
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from tidewire.client import AsyncClient, TlsOptions
from tidewire.client._transport import parse_addrs
from tidewire.errors import InvalidConfigError, TidewireError
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
    "add_credential_options",
    "add_tls_options",
    "cli_credentials",
    "cli_tls",
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
        help="The broker, HOST:PORT; a cluster: several nodes, comma-separated.",
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

#: The TLS options of the command running (set by the wrapper :func:`add_tls_options` puts
#: around it).
_TLS: ContextVar[TlsOptions | None] = ContextVar("tidewire_cli_tls", default=None)


def _tls_param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


_TLS_PANEL = "TLS"
#: The options every command with ``--addr`` takes (each with its environment variable).
_TLS_PARAMS = (
    _tls_param(
        "tls",
        Annotated[
            bool,
            typer.Option(
                "--tls",
                envvar="TIDEWIRE_TLS",
                help="Connect with TLS, verifying the broker against the system's CAs "
                "(implied by the other --tls-* options).",
                show_envvar=True,
                show_default=False,
                rich_help_panel=_TLS_PANEL,
            ),
        ],
        False,
    ),
    _tls_param(
        "tls_ca",
        Annotated[
            str | None,
            typer.Option(
                "--tls-ca",
                envvar="TIDEWIRE_TLS_CA",
                help="PEM CA file the broker's certificate is verified against.",
                show_envvar=True,
                show_default=False,
                rich_help_panel=_TLS_PANEL,
            ),
        ],
        None,
    ),
    _tls_param(
        "tls_cert",
        Annotated[
            str | None,
            typer.Option(
                "--tls-cert",
                envvar="TIDEWIRE_TLS_CERT",
                help="PEM client certificate, for a broker that asks for one (mTLS).",
                show_envvar=True,
                show_default=False,
                rich_help_panel=_TLS_PANEL,
            ),
        ],
        None,
    ),
    _tls_param(
        "tls_key",
        Annotated[
            str | None,
            typer.Option(
                "--tls-key",
                envvar="TIDEWIRE_TLS_KEY",
                help="PEM private key of --tls-cert (default: in the --tls-cert file).",
                show_envvar=True,
                show_default=False,
                rich_help_panel=_TLS_PANEL,
            ),
        ],
        None,
    ),
    _tls_param(
        "tls_server_name",
        Annotated[
            str | None,
            typer.Option(
                "--tls-server-name",
                envvar="TIDEWIRE_TLS_SERVER_NAME",
                help="Name the broker's certificate must carry (default: the --addr host).",
                show_envvar=True,
                show_default=False,
                rich_help_panel=_TLS_PANEL,
            ),
        ],
        None,
    ),
)
_TLS_NAMES = tuple(p.name for p in _TLS_PARAMS)


def cli_tls() -> TlsOptions | None:
    """The TLS options given to the command running (None: plaintext)."""
    return _TLS.get()


def _tls_of(
    tls: bool,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_server_name: str | None,
) -> TlsOptions | None:
    if not (tls or tls_ca or tls_cert or tls_key or tls_server_name):
        return None
    options = TlsOptions(
        ca_file=tls_ca or None,
        cert_file=tls_cert or None,
        key_file=tls_key or None,
        server_hostname=tls_server_name or None,
    )
    options.context()  # a file that cannot be loaded is a usage error, named now
    return options


def _with_tls(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with the TLS options added to its parameters; while it runs,
    :func:`cli_tls` returns them."""
    sig = inspect.signature(func, eval_str=True)

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in _TLS_NAMES}
        try:
            options = _tls_of(**given)
        except InvalidConfigError as exc:
            fail(exc.message, EXIT_USAGE)
        token = _TLS.set(options)
        try:
            return func(*args, **kwargs)
        finally:
            _TLS.reset(token)

    command.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[*sig.parameters.values(), *_TLS_PARAMS]
    )
    return command


def add_tls_options(app: typer.Typer) -> None:
    """Give every command of ``app`` (and of its sub-apps) that takes ``--addr`` the TLS
    options ``--tls``, ``--tls-ca``, ``--tls-cert``, ``--tls-key`` and
    ``--tls-server-name``; the command reads them with :func:`cli_tls`."""
    for info in app.registered_commands:
        callback = info.callback
        if callback is not None and "addr" in inspect.signature(callback).parameters:
            info.callback = _with_tls(callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            add_tls_options(group.typer_instance)


#: The credentials of the command running (set by the wrapper :func:`add_credential_options`
#: puts around it).
_CREDS: ContextVar[Credentials | None] = ContextVar("tidewire_cli_credentials", default=None)
#: The options every client command takes to authenticate (each with its environment
#: variable), unless it declares them itself.
_CRED_PARAMS = (
    _tls_param("api_key", ApiKeyOption, None),
    _tls_param("sasl_mechanism", SaslMechanismOption, DEFAULT_MECHANISM),
)


def cli_credentials() -> Credentials | None:
    """The credentials given to the command running (None: no ``--api-key``)."""
    return _CREDS.get()


def _with_credentials(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with ``--api-key`` and ``--sasl-mechanism`` added to its parameters; while it
    runs, :func:`cli_credentials` returns them."""
    sig = inspect.signature(func, eval_str=True)

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        creds = credentials(kwargs.pop("api_key"), kwargs.pop("sasl_mechanism"))
        token = _CREDS.set(creds)
        try:
            return func(*args, **kwargs)
        finally:
            _CREDS.reset(token)

    command.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[*sig.parameters.values(), *_CRED_PARAMS]
    )
    return command


def add_credential_options(app: typer.Typer) -> None:
    """Give every command of ``app`` (and of its sub-apps) that takes ``--addr`` the options
    ``--api-key`` (``TIDEWIRE_API_KEY``) and ``--sasl-mechanism``, unless it declares them
    itself; the command reads them with :func:`cli_credentials`, and :func:`run_client`
    authenticates with them."""
    for info in app.registered_commands:
        callback = info.callback
        if callback is None:
            continue
        params = inspect.signature(callback).parameters
        if "addr" in params and "api_key" not in params:
            info.callback = _with_credentials(callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            add_credential_options(group.typer_instance)


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def echo_json(doc: object) -> None:
    """Print one JSON document on one line."""
    typer.echo(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))


def check_addr(addr: str) -> None:
    """Exit with a usage error unless ``addr`` is ``HOST:PORT``, or several of them separated
    by commas (a cluster's bootstrap list: the client asks them in turn)."""
    try:
        parse_addrs(addr)
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
    returned. ``creds``: the credentials to authenticate with (default: those of the
    command's ``--api-key``). An error from the broker or the connection prints one line on
    stderr and exits 1; Ctrl-C exits 130 after closing the connection."""
    check_addr(addr)
    if creds is None:
        creds = cli_credentials()

    tls = cli_tls()

    async def main() -> T:
        async with AsyncClient(
            addr,
            request_timeout_s=request_timeout_s,
            connect_timeout_s=connect_timeout_s,
            credentials=creds,
            tls=tls,
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
