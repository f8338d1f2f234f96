"""``tidewire certs init DIR``: a development CA, a server certificate and client
certificates, so that TLS (and mutual TLS) can be tried in one command (docs/security.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from tidewire.security.certs import DEFAULT_DAYS, issue, make_ca, write_key, write_pem

from ._common import EXIT_USAGE, JsonOption, echo_json, fail

__all__ = ["certs_app"]

certs_app = typer.Typer(
    name="certs",
    help="Development TLS certificates.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

#: A client name: its certificate's CN (the principal) and its files' name.
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Longest validity accepted (days): ten years is already far more than a test needs.
MAX_DAYS = 3650


@certs_app.command("init")
def init(
    directory: Annotated[
        Path,
        typer.Argument(help="Where to write the files (created if missing).", show_default=False),
    ],
    hosts: Annotated[
        str,
        typer.Option(
            "--hosts",
            help="Comma-separated host names and IP addresses the server certificate is for.",
        ),
    ] = "localhost,127.0.0.1,::1",
    clients: Annotated[
        list[str] | None,
        typer.Option(
            "--client",
            help="Also make a client certificate NAME.pem / NAME.key (CN=NAME, the principal "
            "the broker sees); repeatable.",
            show_default=False,
        ),
    ] = None,
    days: Annotated[
        int, typer.Option("--days", help=f"Validity of every certificate (1..{MAX_DAYS}).")
    ] = DEFAULT_DAYS,
    force: Annotated[
        bool,
        typer.Option("--force", help="Overwrite files that exist already.", show_default=False),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Make a development CA (ca.pem, ca.key), a server certificate (server.pem,
    server.key) for --hosts, and a certificate per --client (NAME.pem, NAME.key), all
    signed by the CA; keys are readable by their owner alone. Prints the serve and client
    flags that use them. For trying TLS, not for production."""
    host_list = [h.strip() for h in hosts.split(",") if h.strip()]
    if not host_list:
        fail("--hosts: give at least one host name or address", EXIT_USAGE)
    if not 1 <= days <= MAX_DAYS:
        fail(f"--days={days} must be within 1..{MAX_DAYS}", EXIT_USAGE)
    names = list(dict.fromkeys(clients or []))
    for name in names:
        if not _CLIENT_NAME.fullmatch(name) or name in ("ca", "server"):
            fail(
                f"--client {name!r}: a name of 1..64 letters, digits, '.', '_' or '-' "
                "(not starting with '.', '_' or '-'; not 'ca' or 'server')",
                EXIT_USAGE,
            )
    files = ["ca.pem", "ca.key", "server.pem", "server.key"]
    files += [f"{n}.{ext}" for n in names for ext in ("pem", "key")]
    paths = [directory / f for f in files]
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        fail(f"{', '.join(existing)} exist already (--force overwrites)", EXIT_USAGE)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        ca = make_ca(days=days)
        server = issue(ca, host_list[0], hosts=tuple(host_list), days=days)
        write_pem(directory / "ca.pem", ca.cert_pem)
        write_key(directory / "ca.key", ca.key_pem)
        write_pem(directory / "server.pem", server.cert_pem)
        write_key(directory / "server.key", server.key_pem)
        for name in names:
            cert = issue(ca, name, client=True, days=days)
            write_pem(directory / f"{name}.pem", cert.cert_pem)
            write_key(directory / f"{name}.key", cert.key_pem)
    except OSError as exc:
        fail(f"cannot write to {directory}: {exc.strerror or exc}")
    d = directory
    serve_flags = [
        f"--tls-cert-file {d / 'server.pem'}",
        f"--tls-key-file {d / 'server.key'}",
    ]
    if names:
        serve_flags += [f"--tls-ca-file {d / 'ca.pem'}", "--tls-client-auth required"]
    client_flags = [f"--tls-ca {d / 'ca.pem'}"]
    if names:
        client_flags += [f"--tls-cert {d / names[0]}.pem", f"--tls-key {d / names[0]}.key"]
    if as_json:
        echo_json(
            {
                "directory": str(d),
                "files": [str(p) for p in paths],
                "hosts": host_list,
                "clients": names,
                "days": days,
                "serve_flags": " ".join(serve_flags),
                "client_flags": " ".join(client_flags),
            }
        )
        return
    typer.echo(f"wrote {', '.join(files)} to {d} (valid {days} days; for development only)")
    typer.echo(f"serve with:   tidewire serve {' '.join(serve_flags)}")
    typer.echo(f"connect with: tidewire topic list {' '.join(client_flags)}")
    typer.echo(
        f"HTTPS (serve --http-port 8080): curl --cacert {d / 'ca.pem'} "
        f"https://{host_list[0]}:8080/healthz/live"
    )
